"""Ownership: pvegpu's mark (tag `pvegpu`, `pvegpu-owner: <id>` in the description) on what it creates,
and the one-line refusal of a guest or `gpuN` mapping without it unless adopted (pvegpu/plan/ownership.py).
API answers synthesized as proxmox-api-behaviour.md §4/§6/§3 describe them (typed config, `digest`)."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.models.lxc import LxcSpec
from pvegpu.models.node import GpuSelector
from pvegpu.models.pve import PciMapping
from pvegpu.models.vm import VmSpec
from pvegpu.operations.convert import q35_conversion
from pvegpu.operations.lxc import lxc_container
from pvegpu.operations.mapping import foreign_mappings, pci_mappings
from pvegpu.operations.pve_guest import CT, VM, Guest, Ownership, guest_parked, refuse_foreign
from pvegpu.plan.lxc import ContainerPlan, container_config, create_keys, plan_lxc_devices
from pvegpu.plan.mapping import plan_mappings
from pvegpu.plan.ownership import (
    guest_mark,
    guest_mark_keys,
    mapping_description,
    marked_description,
    owner_id,
)
from pvegpu.plan.topology import plan_topology
from pvegpu.plan.vm import VmPlan
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import ConfigStore, FakeApi, MappingStore, execute, task_ok
from tests.unit.hostdata import two_cards
from tests.unit.op_harness import run_op

OWNER = "lab"
CT_OWNED = Ownership(OWNER, adopt=False, switch="lxc.adopt")
CT_ADOPT = Ownership(OWNER, adopt=True, switch="lxc.adopt")
VM_OWNED = Ownership(OWNER, adopt=False, switch="vm.adopt")
SPEC = LxcSpec(vmid=200, ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst", cores=8)
CONFIG = container_config(SPEC, plan_lxc_devices(2, (8, 2), (), {}))
CT_CONFIG = "/nodes/pve1/lxc/200/config"
CT_STATUS = "/nodes/pve1/lxc/200/status/current"
VM_CONFIG = "/nodes/pve1/qemu/100/config"
MISSING = PveError(500, "Configuration file 'nodes/pve1/lxc/200.conf' does not exist")
MODIFIED = "detected modified configuration - file changed by other user? Try again."
UPID_CREATE = "UPID:pve1:0000B1B2:0153F2C4:66A1B2C3:vzcreate:200:root@pam:"
MARK = {"tags": "pvegpu", "description": "pvegpu-owner: lab"}
DESIRED = plan_mappings({"pve1": plan_topology(two_cards(), GpuSelector(ids=("10de:2bb1",)))})
E0, E1 = DESIRED[0].map[0], DESIRED[1].map[0]


def converged(values: dict[str, Any]) -> dict[str, Any]:
    """The container as Proxmox types `CONFIG` back, with `values` on top."""
    typed = {**CONFIG, "cores": 8, "memory": 65536, "swap": 0, "onboot": 1, "digest": "d1"}
    return typed | values


def converge_ct(api: FakeApi, ownership: Ownership) -> tuple[list[Any], list[str]]:
    return run_op(
        lxc_container,
        {},
        guest=Guest(CT, api.client, "pve1", 200),
        container=ContainerPlan(SPEC, CONFIG, create_keys(SPEC), (), host_module=None),
        timeout_s=5,
        ownership=ownership,
    )


# --- the plan ---------------------------------------------------------------------------------------


def test_owner_id_is_pve_owner_else_cluster_else_node() -> None:
    assert [owner_id("ops", "c1", "pve1"), owner_id(None, "c1", "pve1"), owner_id(None, None, "pve1")] == [
        "ops",
        "c1",
        "pve1",
    ]


def test_mark_needs_the_tag_and_this_owner() -> None:
    assert guest_mark({"tags": "prod;pvegpu", "description": "notes\npvegpu-owner: lab\n"}, OWNER).ours
    assert guest_mark({"tags": "PVEGPU", "description": "pvegpu-owner: lab"}, OWNER).ours
    assert guest_mark({"description": "pvegpu-owner: lab"}, OWNER).found == (
        "pvegpu-owner: lab without the tag pvegpu"
    )
    assert guest_mark({"tags": "db"}, OWNER).found == "no pvegpu mark"
    assert guest_mark({"tags": "pvegpu"}, OWNER).found == "tag pvegpu without a pvegpu-owner: line"
    assert (
        guest_mark({"tags": "pvegpu", "description": "pvegpu-owner: ops"}, OWNER).found == "pvegpu-owner: ops"
    )


def test_mark_keys_keep_the_operators_tags_and_text() -> None:
    assert guest_mark_keys({"tags": "Prod web", "description": "Alice's VM"}, OWNER) == {
        "tags": "prod;pvegpu;web",
        "description": "Alice's VM\npvegpu-owner: lab",
    }
    assert guest_mark_keys({"tags": "pvegpu", "description": "pvegpu-owner: lab\n"}, OWNER) == {}
    assert marked_description("x\npvegpu-owner: ops", OWNER) == "x\npvegpu-owner: lab"
    assert mapping_description("RTX 6000 pvegpu-owner: ops", OWNER) == "RTX 6000 pvegpu-owner: lab"
    assert mapping_description(None, OWNER) == "pvegpu-owner: lab"


# --- guests -------------------------------------------------------------------------------------------


def test_error_foreign_vm_is_refused_in_one_line_before_anything_is_written() -> None:
    api = FakeApi({("GET", VM_CONFIG): {"name": "alice-db", "tags": "db", "digest": "v1"}})

    with pytest.raises(OperationError) as refused:
        refuse_foreign(Guest(VM, api.client, "pve1", 100), VM_OWNED)

    assert str(refused.value) == (
        "VM 100 on pve1 is not pvegpu's (no pvegpu mark): left as it is; to let pvegpu manage it, set "
        "vm.adopt: true (adopting writes pvegpu's mark)"
    )
    assert api.writes() == []


def test_error_vm_of_another_inventory_is_refused_naming_its_owner() -> None:
    theirs = {"tags": "pvegpu", "description": "pvegpu-owner: ops", "digest": "v1"}
    api = FakeApi({("GET", VM_CONFIG): theirs})

    with pytest.raises(OperationError) as refused:
        refuse_foreign(Guest(VM, api.client, "pve1", 100), VM_OWNED)

    assert str(refused.value).startswith("VM 100 on pve1 is not pvegpu's (pvegpu-owner: ops): left as it is;")


def test_error_conversion_of_an_unmarked_vm_needs_vm_adopt() -> None:
    installed = {"name": "alice", "ostype": "l26", "scsi0": "local-lvm:vm-100-disk-0", "digest": "v1"}
    api = FakeApi({("GET", VM_CONFIG): installed})

    with pytest.raises(OperationError) as refused:
        run_op(
            q35_conversion,
            {},
            guest=Guest(VM, api.client, "pve1", 100),
            vm=VmPlan(VmSpec(vmid=100), {}, {}, clique="", storages={}, unbound=(), problem=None),
            timeout_s=5,
            ownership=VM_OWNED,
        )

    assert str(refused.value) == (
        "VM 100 on pve1 is not pvegpu's (no pvegpu mark): left as it is; to let pvegpu manage it, set "
        "vm.adopt: true (adopting writes pvegpu's mark)"
    )
    assert api.writes() == []


def test_error_foreign_container_is_refused_by_its_converge() -> None:
    api = FakeApi({("GET", CT_CONFIG): converged({})})

    with pytest.raises(OperationError) as refused:
        converge_ct(api, CT_OWNED)

    assert str(refused.value) == (
        "CT 200 on pve1 is not pvegpu's (no pvegpu mark): left as it is; to let pvegpu manage it, set "
        "lxc.adopt: true (adopting writes pvegpu's mark)"
    )
    assert api.writes() == []


def test_create_container_carries_the_mark() -> None:
    store = ConfigStore(None, missing=MISSING, mismatch=MODIFIED)
    api = FakeApi(
        {
            ("GET", CT_CONFIG): store.get,
            ("POST", "/nodes/pve1/lxc"): store.create(converged(MARK), UPID_CREATE),
            ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status"): task_ok(UPID_CREATE),
        }
    )

    commands, _ = converge_ct(api, CT_OWNED)
    execute(commands)

    [(method, path, sent)] = api.writes()
    # the mark, then the create's nonce line (pvegpu/plan/create_proof.py), which the create removes again
    assert (method, path, sent["tags"], sent["description"].splitlines()[0]) == (
        "POST",
        "/nodes/pve1/lxc",
        "pvegpu",
        "pvegpu-owner: lab",
    )


def test_adopt_writes_the_mark_then_the_next_run_changes_nothing() -> None:
    store = ConfigStore(converged({"tags": "mine"}), missing=MISSING, mismatch=MODIFIED)
    api = FakeApi({("GET", CT_CONFIG): store.get, ("PUT", CT_CONFIG): store.put})

    commands, _ = converge_ct(api, CT_ADOPT)
    execute(commands)

    assert api.writes() == [
        ("PUT", CT_CONFIG, {"tags": "mine;pvegpu", "description": "pvegpu-owner: lab", "digest": "d1"})
    ]
    again, noops = converge_ct(api, CT_OWNED)  # the switch no longer needed
    assert (again, noops) == ([], ["CT 200 on pve1 has its config: 6 device entries"])


def test_noop_foreign_container_is_not_parked() -> None:
    api = FakeApi(
        {("GET", CT_CONFIG): {"onboot": 1, "digest": "d1"}, ("GET", CT_STATUS): {"status": "running"}}
    )

    commands, noops = run_op(
        guest_parked,
        {},
        guest=Guest(CT, api.client, "pve1", 200),
        profile="vm",
        allow_stop=True,
        timeout_s=5,
        ownership=CT_OWNED,
    )

    assert (commands, noops) == (
        [],
        [
            "CT 200 on pve1 is not pvegpu's (no pvegpu mark): left alone, not stopped (lxc.adopt: true lets "
            "pvegpu manage it)"
        ],
    )
    assert api.writes() == []


# --- mappings -------------------------------------------------------------------------------------------


def sync(api: FakeApi, adopt: bool = False) -> tuple[list[Any], list[str]]:
    return run_op(
        pci_mappings,
        {},
        api=api.client,
        desired=DESIRED,
        node="pve1",
        prefix="gpu",
        cluster=("pve1",),
        owner=OWNER,
        adopt=adopt,
    )


def test_error_foreign_mapping_is_refused_before_anything_is_written() -> None:
    store = MappingStore(("gpu0", [E0]))  # someone's own gpu0, by hand: no description
    api = FakeApi(store.answers("gpu0", "gpu1"))

    with pytest.raises(OperationError) as refused:
        sync(api)
    with pytest.raises(OperationError) as preparing:
        foreign_mappings(api.client, DESIRED, "pve1", "gpu", owner=OWNER, adopt=False)

    assert (
        str(refused.value)
        == str(preparing.value)
        == (
            "mapping gpu0 on pve1 is not pvegpu's (no pvegpu mark): left as it is; to let pvegpu manage it, "
            "set mapping.adopt: true (adopting writes pvegpu's mark)"
        )
    )
    assert api.writes() == []


def test_mappings_created_marked_and_adopted_marked_then_unchanged() -> None:
    store = MappingStore(("gpu0", [E0]))
    store.descriptions["gpu0"] = "Alice's card"
    api = FakeApi(store.answers("gpu0", "gpu1"))

    commands, _ = sync(api, adopt=True)
    execute(commands)

    assert api.writes() == [
        (
            "PUT",
            "/cluster/mapping/pci/gpu0",
            {"map": [E0], "description": "Alice's card pvegpu-owner: lab", "digest": "d1"},
        ),
        ("POST", "/cluster/mapping/pci", {"id": "gpu1", "map": [E1], "description": "pvegpu-owner: lab"}),
    ]
    again, noops = sync(api)
    assert (again, noops) == (
        [],
        ["PCI mappings gpu0, gpu1 match the live GPUs and pass Proxmox's check on pve1"],
    )
    assert PciMapping("gpu0", (E0,)) == DESIRED[0]
