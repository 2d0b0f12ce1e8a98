"""`pci_mappings`: API state in -> exact API calls out (when executed), or the noop sentence, or the error.

Mapping entries are synthesized in the canonical form of proxmox-pci-mapping.md §2; API answers follow
proxmox-api-behaviour.md §3 (list with check-node, digest of the whole file, Proxmox's error texts)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.models.node import GpuSelector
from pvegpu.models.pve import PciMapping
from pvegpu.operations.mapping import describe, pci_mappings
from pvegpu.plan.mapping import Action, MappingChange, plan_mappings
from pvegpu.plan.topology import plan_topology
from pvegpu.pve.errors import PveConnectionError, PveError, Unparsed
from tests.unit.fake_pve import MODIFIED, FakeApi, MappingStore, execute
from tests.unit.hostdata import two_cards
from tests.unit.op_harness import run_op

PVE2 = "id=10de:2bb1,node=pve2,path=0000:21:00,iommugroup=9,subsystem-id=10de:204b"
KEPT_LOG = "[pve1] gpu0 pve2: keep 0000:21:00 group 9 (10de:2bb1), not a node of this inventory's cluster"

LIST = ("GET", "/cluster/mapping/pci")
E0 = "id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:204b"
E1 = "id=10de:2bb1,node=pve1,path=0000:51:00,iommugroup=24,subsystem-id=10de:204b"
OLD0 = "id=10de:2bb1,node=pve1,path=0000:21:00,iommugroup=9,subsystem-id=10de:204b"
DESIRED = plan_mappings({"pve1": plan_topology(two_cards(), GpuSelector(ids=("10de:2bb1",)))})
NIC = "id=8086:1521,node=pve1,path=0000:61:00.0"
CUT = Unparsed('[{"digest":"d1","id":"gpu0","map":["id=10de:2bb1,no')  # a reply cut off mid-way
HTML = Unparsed("<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>\n")


def sync(
    api: FakeApi, desired: tuple[PciMapping, ...] = DESIRED, cluster: tuple[str, ...] = ("pve1",)
) -> tuple[list[Any], list[str]]:
    return run_op(
        pci_mappings, {}, api=api.client, desired=desired, node="pve1", prefix="gpu", cluster=cluster
    )


def fake(store: MappingStore, **overrides: object) -> FakeApi:
    """The store's endpoints; `overrides` replace one answer: `post`, `put0`, `get0`, `list`."""
    answers = store.answers("gpu0", "gpu1")
    paths = {
        "post": ("POST", "/cluster/mapping/pci"),
        "put0": ("PUT", "/cluster/mapping/pci/gpu0"),
        "get0": ("GET", "/cluster/mapping/pci/gpu0"),
        "list": LIST,
    }
    answers.update({paths[name]: answer for name, answer in overrides.items()})
    return FakeApi(answers)


def test_plan_gives_one_mapping_per_card() -> None:
    assert (PciMapping("gpu0", (E0,)), PciMapping("gpu1", (E1,))) == DESIRED


def test_create_posts_each_missing_mapping_and_leaves_foreign_ids_alone() -> None:
    store = MappingStore(("nic0", [NIC]))
    api = fake(store)

    commands, noops = sync(api)
    assert api.calls == [("GET", "/cluster/mapping/pci", {"check-node": "pve1"})]  # preparing only reads
    execute(commands)

    assert noops == []
    assert api.writes() == [
        ("POST", "/cluster/mapping/pci", {"id": "gpu0", "map": [E0]}),
        ("POST", "/cluster/mapping/pci", {"id": "gpu1", "map": [E1]}),
    ]
    assert store.maps == {"nic0": [NIC], "gpu0": [E0], "gpu1": [E1]}


def test_noop_when_every_mapping_matches_and_passes_proxmox_check() -> None:
    # Written in the GUI's key order: same meaning, so unchanged.
    gui_order = "path=0000:41:00,node=pve1,id=10de:2bb1,subsystem-id=10de:204b,iommugroup=14"
    api = fake(MappingStore(("gpu0", [gui_order]), ("gpu1", [E1]), ("nic0", [NIC])))

    commands, noops = sync(api)

    assert commands == []
    assert noops == ["PCI mappings gpu0, gpu1 match the live GPUs and pass Proxmox's check on pve1"]


def test_bios_renumbered_update_puts_the_whole_map_with_the_digest_of_a_fresh_read() -> None:
    store = MappingStore(("gpu0", [OLD0]), ("gpu1", [E1]), ("nic0", [NIC]))
    store.checks["gpu0"] = [
        {"severity": "error", "message": "Invalid configuration: pci device '0000:21:00.0' not found\n"}
    ]
    api = fake(store)

    commands, noops = sync(api)
    store.maps["nic0"] = [NIC.replace("61", "62")]  # someone edits another mapping meanwhile
    store.version += 1
    execute(commands)

    assert noops == []
    assert api.writes() == [("PUT", "/cluster/mapping/pci/gpu0", {"map": [E0], "digest": "d2"})]
    assert store.maps["gpu0"] == [E0]


def test_error_digest_mismatch_fails_with_proxmox_message_and_nothing_else_is_written() -> None:
    store = MappingStore(("gpu0", [OLD0]), ("gpu1", [E1]))
    api = fake(store, put0=PveError(500, MODIFIED))
    commands, _ = sync(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        f"mapping gpu0 not updated, nothing overwritten: PUT /cluster/mapping/pci/gpu0: {MODIFIED}"
    )
    assert api.writes() == [("PUT", "/cluster/mapping/pci/gpu0", {"map": [E0], "digest": "d1"})]
    assert store.maps["gpu0"] == [OLD0]


def test_error_mapping_edited_by_someone_else_after_the_diff_is_not_overwritten() -> None:
    theirs = "id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=99,subsystem-id=10de:204b"
    store = MappingStore(("gpu0", [OLD0]), ("gpu1", [E1]))
    api = fake(store)
    commands, _ = sync(api)
    store.maps["gpu0"] = [theirs]

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        f"mapping gpu0 changed since pvegpu read it (now ['{theirs}']): not overwritten; run again"
    )
    assert api.writes() == []


def test_error_proxmox_check_fails_although_pvegpu_sees_no_difference() -> None:
    store = MappingStore(("gpu0", [E0]), ("gpu1", [E1]))
    store.checks["gpu0"] = [
        {"severity": "error", "message": "Invalid configuration: 'mdev' does not match for 'gpu0' (0 != 1)\n"}
    ]

    with pytest.raises(OperationError) as error:
        sync(fake(store))

    assert str(error.value) == (
        "the mappings match the live GPUs, but Proxmox's check on pve1 fails: "
        "gpu0: Invalid configuration: 'mdev' does not match for 'gpu0' (0 != 1)"
    )


def test_error_create_of_an_id_created_meanwhile_is_not_overwritten_and_stops_the_rest() -> None:
    theirs = "id=10de:2bb1,node=pve1,path=0000:99:00"
    store = MappingStore()
    api = fake(store)
    commands, _ = sync(api)
    store.maps["gpu0"] = [theirs]

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        f"mapping gpu0 holds ['{theirs}'] after POST /cluster/mapping/pci: create hardware mapping failed: "
        f"pci ID 'gpu0' already defined: not what pvegpu sent (['{E0}']); nothing more written; run again"
    )
    assert api.writes() == [("POST", "/cluster/mapping/pci", {"id": "gpu0", "map": [E0]})]


def test_create_two_node_cluster_one_mapping_per_gpu_with_one_map_line_per_node() -> None:
    selector = GpuSelector(ids=("10de:2bb1",))
    desired = plan_mappings(
        {"pve2": plan_topology(two_cards(), selector), "pve1": plan_topology(two_cards(), selector)}
    )
    api = fake(MappingStore())

    commands, _ = sync(api, desired, ("pve1", "pve2"))
    execute(commands)

    assert api.writes() == [
        ("POST", "/cluster/mapping/pci", {"id": "gpu0", "map": [E0, E0.replace("pve1", "pve2")]}),
        ("POST", "/cluster/mapping/pci", {"id": "gpu1", "map": [E1, E1.replace("pve1", "pve2")]}),
    ]


# --- honest outcomes: what is said follows what reading back shows -----------------------------------


def test_drift_create_cut_after_proxmox_wrote_is_created_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MappingStore()
    store.after_write = PveConnectionError("ssh root@pve1:22: SSH session not active")
    api = fake(store)
    commands, _ = sync(api)

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        execute(commands)

    assert store.maps == {"gpu0": [E0], "gpu1": [E1]}
    assert caplog.messages == [
        f"[pve1] mapping {i}: POST /cluster/mapping/pci: ssh root@pve1:22: SSH session not active; "
        "reading it back shows it as planned"
        for i in ("gpu0", "gpu1")
    ]


def test_drift_update_cut_after_proxmox_wrote_is_updated_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MappingStore(("gpu0", [OLD0]), ("gpu1", [E1]))
    store.after_write = PveConnectionError("ssh root@pve1:22: SSH session not active")
    commands, _ = sync(fake(store))

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        execute(commands)

    assert store.maps["gpu0"] == [E0]
    assert caplog.messages == [
        "[pve1] mapping gpu0: PUT /cluster/mapping/pci/gpu0: ssh root@pve1:22: SSH session not active; "
        "reading it back shows it as planned"
    ]


def test_error_post_answering_garbage_with_exit_0_is_not_taken_for_a_creation() -> None:
    store = MappingStore()
    api = fake(store, post=HTML)
    commands, _ = sync(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "mapping gpu0 not created: POST /cluster/mapping/pci answered without an error, "
        "but GET /cluster/mapping/pci/gpu0 finds no such mapping"
    )
    assert len(api.writes()) == 1


def test_error_put_answering_garbage_with_exit_0_is_not_taken_for_an_update() -> None:
    store = MappingStore(("gpu0", [OLD0]), ("gpu1", [E1]))
    commands, _ = sync(fake(store, put0=HTML))

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "mapping gpu0 not updated, nothing overwritten: PUT /cluster/mapping/pci/gpu0 answered without an "
        "error, but reading it back shows it unchanged"
    )


def test_error_failed_post_and_failed_read_back_say_the_outcome_is_unknown() -> None:
    store = MappingStore()
    api = fake(store, post=PveConnectionError("ssh root@pve1:22: SSH session not active"))
    commands, _ = sync(api)
    api.answers[("GET", "/cluster/mapping/pci/gpu0")] = HTML

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "mapping gpu0: POST /cluster/mapping/pci: ssh root@pve1:22: SSH session not active; reading it back "
        "failed: GET /cluster/mapping/pci/gpu0: expected an object, got '<!DOCTYPE html>'; whether it was "
        "created is unknown, nothing more written; run again"
    )
    assert len(api.writes()) == 1


@pytest.mark.parametrize(
    ("answer", "got"),
    [
        (HTML, "expected a list, got '<!DOCTYPE html>'"),
        (CUT, f"expected a list, got '{CUT.text}'"),
        ({"data": []}, """expected a list, got '{"data": []}'"""),
        (
            [{"id": "gpu0", "map": [E0]}],
            "expected an object with 'digest', got "
            f"""'[{{"id": "gpu0", "map": ["{E0}"]}}]'""",
        ),
        (
            [{"id": "gpu0", "digest": "d1", "map": E0}],
            "expected a list, got "
            f"""'[{{"digest": "d1", "id": "gpu0", "map": "{E0}"}}]'""",
        ),
        (None, "expected a list, got nothing"),
    ],
)
def test_error_garbage_from_the_list_fails_before_any_write(answer: object, got: str) -> None:
    api = fake(MappingStore(("gpu0", [OLD0])), list=lambda _params: answer)

    with pytest.raises(OperationError) as error:
        sync(api)

    assert str(error.value) == f"PCI mappings not read: GET /cluster/mapping/pci: {got}; nothing written"
    assert api.writes() == []


def test_error_garbage_from_the_read_before_an_update_fails_before_the_put() -> None:
    store = MappingStore(("gpu0", [OLD0]), ("gpu1", [E1]))
    api = fake(store)
    commands, _ = sync(api)
    api.answers[("GET", "/cluster/mapping/pci/gpu0")] = {"type": "pci", "map": [OLD0]}

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "mapping gpu0 not updated: GET /cluster/mapping/pci/gpu0: expected an object with 'digest', got "
        f"""'{{"map": ["{OLD0}"], "type": "pci"}}'; nothing written"""
    )
    assert api.writes() == []


def test_describe_names_added_nodes_and_unreadable_entries() -> None:
    change = MappingChange(Action.UPDATE, "gpu0", (E0, E0.replace("pve1", "pve2")), (E0, "path=0000:41:00"))

    assert describe(change) == [
        "gpu0 pve2: add 0000:41:00 group 14 (10de:2bb1)",
        "gpu0: replace unreadable entry 'path=0000:41:00'",
    ]


def test_noop_another_admins_line_of_a_node_outside_the_cluster_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = fake(MappingStore(("gpu0", [E0, PVE2]), ("gpu1", [E1])))

    with caplog.at_level(logging.INFO, logger="pyinfra"):
        commands, noops = sync(api)

    assert commands == []
    assert noops == ["PCI mappings gpu0, gpu1 match the live GPUs and pass Proxmox's check on pve1"]
    assert caplog.messages == [KEPT_LOG]


def test_update_of_this_nodes_line_writes_the_kept_line_of_another_node_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MappingStore(("gpu0", [OLD0, PVE2]), ("gpu1", [E1]))
    api = fake(store)

    with caplog.at_level(logging.INFO, logger="pyinfra"):
        commands, _ = sync(api)
    execute(commands)

    assert caplog.messages == [
        KEPT_LOG,
        "[pve1] gpu0 pve1: 0000:21:00 group 9 (10de:2bb1) -> 0000:41:00 group 14 (10de:2bb1)",
    ]
    assert api.writes() == [("PUT", "/cluster/mapping/pci/gpu0", {"map": [E0, PVE2], "digest": "d1"})]
    assert store.maps["gpu0"] == [E0, PVE2]


def test_update_replaces_the_line_of_a_node_in_the_inventorys_cluster(
    caplog: pytest.LogCaptureFixture,
) -> None:
    selector = GpuSelector(ids=("10de:2bb1",))
    desired = plan_mappings(
        {"pve2": plan_topology(two_cards(), selector), "pve1": plan_topology(two_cards(), selector)}
    )
    planned2 = E0.replace("pve1", "pve2")
    store = MappingStore(("gpu0", [E0, PVE2]), ("gpu1", [E1, E1.replace("pve1", "pve2")]))
    api = fake(store)

    with caplog.at_level(logging.INFO, logger="pyinfra"):
        commands, _ = sync(api, desired, ("pve1", "pve2"))
    execute(commands)

    assert caplog.messages == [
        "[pve1] gpu0 pve2: 0000:21:00 group 9 (10de:2bb1) -> 0000:41:00 group 14 (10de:2bb1)"
    ]
    assert api.writes() == [("PUT", "/cluster/mapping/pci/gpu0", {"map": [E0, planned2], "digest": "d1"})]
    assert store.maps["gpu0"] == [E0, planned2]
