"""`pci_mappings`: API state in -> exact API calls out (when executed), or the noop sentence, or the error.

Mapping entries are synthesized in the canonical form of proxmox-pci-mapping.md §2; API answers follow
proxmox-api-behaviour.md §3 (list with check-node, digest of the whole file, Proxmox's error texts)."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.models.inventory import GpuSelector
from pvegpu.models.pve import PciMapping
from pvegpu.operations.mapping import describe, pci_mappings
from pvegpu.plan.mapping import Action, MappingChange, plan_mappings
from pvegpu.plan.topology import plan_topology
from pvegpu.pve import PveError
from tests.unit.fake_pve import FakeApi, execute
from tests.unit.hostdata import two_cards
from tests.unit.op_harness import run_op

LIST = ("GET", "/cluster/mapping/pci")
E0 = "id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:204b"
E1 = "id=10de:2bb1,node=pve1,path=0000:51:00,iommugroup=24,subsystem-id=10de:204b"
OLD0 = "id=10de:2bb1,node=pve1,path=0000:21:00,iommugroup=9,subsystem-id=10de:204b"
DESIRED = plan_mappings({"pve1": plan_topology(two_cards(), GpuSelector(ids=("10de:2bb1",)))})
FOREIGN = {"id": "nic0", "type": "pci", "digest": "d1", "map": ["id=8086:1521,node=pve1,path=0000:61:00.0"]}
MODIFIED = (
    "update hardware mapping failed: detected modified configuration - file changed by other user? Try again."
)


def held(mapping_id: str, *entries: str, checks: list[dict[str, str]] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": mapping_id, "type": "pci", "digest": "d1", "map": list(entries)}
    if checks is not None:
        item["checks"] = checks
    return item


def sync(api: FakeApi, desired: tuple[PciMapping, ...] = DESIRED) -> tuple[list[Any], list[str]]:
    return run_op(pci_mappings, {}, api=api.client, desired=desired, node="pve1", prefix="gpu")


def test_plan_gives_one_mapping_per_card() -> None:
    assert (PciMapping("gpu0", (E0,)), PciMapping("gpu1", (E1,))) == DESIRED


def test_create_posts_each_missing_mapping_and_leaves_foreign_ids_alone() -> None:
    api = FakeApi({LIST: [FOREIGN], ("POST", "/cluster/mapping/pci"): None})

    commands, noops = sync(api)
    assert api.calls == [("GET", "/cluster/mapping/pci", {"check-node": "pve1"})]  # preparing only reads
    execute(commands)

    assert noops == []
    assert api.writes() == [
        ("POST", "/cluster/mapping/pci", {"id": "gpu0", "map": [E0]}),
        ("POST", "/cluster/mapping/pci", {"id": "gpu1", "map": [E1]}),
    ]


def test_noop_when_every_mapping_matches_and_passes_proxmox_check() -> None:
    # Written in the GUI's key order: same meaning, so unchanged.
    gui_order = "path=0000:41:00,node=pve1,id=10de:2bb1,subsystem-id=10de:204b,iommugroup=14"
    api = FakeApi({LIST: [held("gpu0", gui_order, checks=[]), held("gpu1", E1, checks=[]), FOREIGN]})

    commands, noops = sync(api)

    assert commands == []
    assert noops == ["PCI mappings gpu0, gpu1 match the live GPUs and pass Proxmox's check on pve1"]


def test_bios_renumbered_update_puts_the_whole_map_with_the_digest_of_a_fresh_read() -> None:
    stale = [{"severity": "error", "message": "Invalid configuration: pci device '0000:21:00.0' not found\n"}]
    api = FakeApi(
        {
            LIST: [held("gpu0", OLD0, checks=stale), held("gpu1", E1, checks=[]), FOREIGN],
            ("GET", "/cluster/mapping/pci/gpu0"): {"type": "pci", "digest": "d2", "map": [OLD0]},
            ("PUT", "/cluster/mapping/pci/gpu0"): None,
        }
    )

    commands, noops = sync(api)
    execute(commands)

    assert noops == []
    assert api.writes() == [("PUT", "/cluster/mapping/pci/gpu0", {"map": [E0], "digest": "d2"})]


def test_error_digest_mismatch_fails_with_proxmox_message_and_nothing_else_is_written() -> None:
    api = FakeApi(
        {
            LIST: [held("gpu0", OLD0, checks=[]), held("gpu1", E1, checks=[])],
            ("GET", "/cluster/mapping/pci/gpu0"): {"type": "pci", "digest": "d2", "map": [OLD0]},
            ("PUT", "/cluster/mapping/pci/gpu0"): PveError(500, MODIFIED),
        }
    )
    commands, _ = sync(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == f"mapping gpu0 not updated, nothing overwritten: {MODIFIED}"
    assert api.writes() == [("PUT", "/cluster/mapping/pci/gpu0", {"map": [E0], "digest": "d2"})]


def test_error_mapping_edited_by_someone_else_after_the_diff_is_not_overwritten() -> None:
    theirs = "id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=99,subsystem-id=10de:204b"
    api = FakeApi(
        {
            LIST: [held("gpu0", OLD0, checks=[]), held("gpu1", E1, checks=[])],
            ("GET", "/cluster/mapping/pci/gpu0"): {"type": "pci", "digest": "d3", "map": [theirs]},
        }
    )
    commands, _ = sync(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        f"mapping gpu0 changed since pvegpu read it (now ['{theirs}']): not overwritten; run again"
    )
    assert api.writes() == []


def test_error_proxmox_check_fails_although_pvegpu_sees_no_difference() -> None:
    mdev = [
        {"severity": "error", "message": "Invalid configuration: 'mdev' does not match for 'gpu0' (0 != 1)\n"}
    ]
    api = FakeApi({LIST: [held("gpu0", E0, checks=mdev), held("gpu1", E1, checks=[])]})

    with pytest.raises(OperationError) as error:
        sync(api)

    assert str(error.value) == (
        "the mappings match the live GPUs, but Proxmox's check on pve1 fails: "
        "gpu0: Invalid configuration: 'mdev' does not match for 'gpu0' (0 != 1)"
    )


def test_error_create_of_an_id_created_meanwhile() -> None:
    exists = "create hardware mapping failed: pci ID 'gpu0' already defined"
    api = FakeApi(
        {LIST: [held("gpu1", E1, checks=[])], ("POST", "/cluster/mapping/pci"): PveError(500, exists)}
    )
    commands, _ = sync(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == f"mapping gpu0 not created: {exists}"


def test_create_two_node_cluster_one_mapping_per_gpu_with_one_map_line_per_node() -> None:
    selector = GpuSelector(ids=("10de:2bb1",))
    desired = plan_mappings(
        {"pve2": plan_topology(two_cards(), selector), "pve1": plan_topology(two_cards(), selector)}
    )
    api = FakeApi({LIST: [], ("POST", "/cluster/mapping/pci"): None})

    commands, _ = sync(api, desired)
    execute(commands)

    assert api.writes() == [
        ("POST", "/cluster/mapping/pci", {"id": "gpu0", "map": [E0, E0.replace("pve1", "pve2")]}),
        ("POST", "/cluster/mapping/pci", {"id": "gpu1", "map": [E1, E1.replace("pve1", "pve2")]}),
    ]


def test_describe_names_added_nodes_and_unreadable_entries() -> None:
    change = MappingChange(Action.UPDATE, "gpu0", (E0, E0.replace("pve1", "pve2")), (E0, "path=0000:41:00"))

    assert describe(change) == [
        "gpu0 pve2: add 0000:41:00 group 14 (10de:2bb1)",
        "gpu0: replace unreadable entry 'path=0000:41:00'",
    ]
