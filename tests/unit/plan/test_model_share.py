"""The model store as the VM sees it (pvegpu/plan/model_share.py, plan/vm.py): the directory mapping's change,
`virtiofs0` in the VM's config by qemu-server version, and the `virtiofsN` slot `diff_vm` takes. Map lines in
Mapping/Dir.pm's $map_fmt (`node=<node>,path=<dir>`), synthesized."""

from __future__ import annotations

import pytest

from pvegpu.models.dir_mapping import DirMapping
from pvegpu.models.model import ModelSpec
from pvegpu.models.node import GpuSelector
from pvegpu.models.vm import VmSpec
from pvegpu.plan.model_share import (
    DirAction,
    ModelShare,
    diff_dir_mapping,
    foreign_line,
    no_virtiofs_line,
    virtiofs_available,
)
from pvegpu.plan.topology import plan_topology
from pvegpu.plan.vm import VmPlan, create_keys, diff_vm, plan_vm, vm_config
from tests.unit.hostdata import two_cards

STORE = "/srv/models/GLM-5-NVFP4"
SHARE = ModelShare(STORE)
MODEL = ModelSpec.model_validate({"source": {"dir": STORE}})
SPEC = VmSpec(vmid=100, self_heal="off", mmio="phys-bits")
PVE2 = "node=pve2,path=/tank/models"
MARKED = "pvegpu model store pvegpu-owner: lab"


def planned(qemu_server: tuple[int, int, int] | None, model: ModelSpec | None = MODEL) -> VmPlan:
    hw = two_cards()
    return plan_vm(
        SPEC,
        hw,
        plan_topology(hw, GpuSelector(ids=("10de:2bb1",))),
        mapping_ids=("gpu0", "gpu1"),
        window=None,
        numa=None,
        numa_problem=None,
        cpu_vendor="amd",
        root_user="root@pam",
        model=model,
        qemu_server=qemu_server,
    )


@pytest.mark.parametrize(
    ("version", "available"),
    [((8, 3, 10), False), ((8, 3, 11), True), ((8, 4, 0), True), ((9, 0, 18), True), (None, True)],
)
def test_virtiofs_available_from_qemu_server_8_3_11(
    version: tuple[int, int, int] | None, available: bool
) -> None:
    assert virtiofs_available(version) is available


def test_create_vm_config_has_virtiofs0_with_qemu_server_9() -> None:
    plan = planned((9, 0, 18))
    assert plan.config["virtiofs0"] == "pvegpu-models"
    assert plan.created_with["virtiofs0"] == "pvegpu-models"
    assert plan.share == ModelShare(STORE)
    assert plan.share_note is None


def test_noop_no_virtiofs_below_8_3_11_and_the_run_says_so() -> None:
    plan = planned((8, 3, 10))
    assert "virtiofs0" not in plan.config
    assert plan.share is None
    assert plan.share_note == (
        "model: qemu-server 8.3.10 has no virtiofs (Proxmox VE 8.4+): the VM's guest fetches the model itself"
    )
    assert no_virtiofs_line((8, 3, 10)) == plan.share_note


def test_noop_without_model_no_virtiofs0_and_no_line() -> None:
    plan = planned((9, 0, 18), model=None)
    assert "virtiofs0" not in plan.config
    assert (plan.share, plan.share_note) == (None, None)


def _diff(
    current: dict[str, object], share: str | None = "pvegpu-models"
) -> tuple[dict[str, str], tuple[str, ...]]:
    desired = vm_config(SPEC, ["gpu0"], None, share=share)
    change = diff_vm(desired, create_keys(SPEC), {**desired, **_disks(), **current}, "gpu")
    return change.set, change.delete


def _disks() -> dict[str, object]:
    return {
        "efidisk0": "local-lvm:vm-100-disk-0",
        "scsi0": "local-lvm:vm-100-disk-1",
        "net0": "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0",
    }


def test_update_virtiofs0_set_when_absent() -> None:
    desired = vm_config(SPEC, ["gpu0"], None, share="pvegpu-models")
    current = {key: value for key, value in desired.items() if key != "virtiofs0"}
    change = diff_vm(desired, create_keys(SPEC), {**current, **_disks()}, "gpu")
    assert (change.set, change.delete) == ({"virtiofs0": "pvegpu-models"}, ())


def test_update_operators_virtiofs0_kept_the_store_takes_the_first_free_slot() -> None:
    assert _diff({"virtiofs0": "scratch,cache=never", "virtiofs1": "logs"}) == (
        {"virtiofs2": "pvegpu-models"},
        (),
    )


def test_noop_a_virtiofs_naming_the_store_is_kept_with_its_options() -> None:
    assert _diff({"virtiofs0": "scratch", "virtiofs3": "pvegpu-models,cache=always"}) == ({}, ())


def test_update_model_removed_deletes_only_pvegpus_virtiofs() -> None:
    assert _diff({"virtiofs0": "scratch", "virtiofs1": "pvegpu-models"}, share=None) == ({}, ("virtiofs1",))


def test_create_absent_mapping_is_created_with_this_nodes_line_and_the_mark() -> None:
    change = diff_dir_mapping(None, SHARE, "pve1", "lab")
    assert change.action is DirAction.CREATE
    assert change.mapping == DirMapping("pvegpu-models", (f"node=pve1,path={STORE}",), MARKED)


def test_update_another_nodes_line_is_kept_and_this_nodes_added() -> None:
    held = DirMapping("pvegpu-models", (PVE2,), "pvegpu model store pvegpu-owner: other")
    change = diff_dir_mapping(held, SHARE, "pve1", "lab")
    assert change.action is DirAction.UPDATE
    assert change.mapping == DirMapping(
        "pvegpu-models", (PVE2, f"node=pve1,path={STORE}"), "pvegpu model store pvegpu-owner: other"
    )


def test_update_this_nodes_old_path_replaced_in_place() -> None:
    held = DirMapping("pvegpu-models", ("node=pve1,path=/old", PVE2), MARKED)
    change = diff_dir_mapping(held, SHARE, "pve1", "lab")
    assert (change.action, change.mapping.map) == (DirAction.UPDATE, (f"node=pve1,path={STORE}", PVE2))


def test_noop_mapping_that_maps_this_node_to_the_store() -> None:
    held = DirMapping("pvegpu-models", (PVE2, f"node=pve1,path={STORE}"), MARKED)
    assert diff_dir_mapping(held, SHARE, "pve1", "lab").action is DirAction.UNCHANGED


def test_error_mapping_without_pvegpus_mark_is_foreign() -> None:
    held = DirMapping("pvegpu-models", (PVE2,), "team share")
    assert diff_dir_mapping(held, SHARE, "pve1", "lab").action is DirAction.FOREIGN
    assert foreign_line("pvegpu-models", "pve1", "team share") == (
        "directory mapping pvegpu-models is not pvegpu's (description 'team share', no pvegpu-owner: line): "
        "left as it is, the model store not shared with the VM on pve1; remove it (pvesh delete "
        "/cluster/mapping/dir/pvegpu-models) or add a pvegpu-owner: line to its description"
    )
