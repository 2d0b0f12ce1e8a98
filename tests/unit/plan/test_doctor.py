"""The node doctor's findings (pvegpu/plan/doctor.py): the exact lines and levels roles/doctor.py logs from
the host's plan and what pvegpu/run/doctor_reads.py read, a failed read included."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pvegpu.models.boot import CpuKernel
from pvegpu.models.doctor import Finding, HookRead, NodeFile, NotRead
from pvegpu.models.groups import PVE_NODES
from pvegpu.models.pve import PciMapping
from pvegpu.models.specs import host_specs
from pvegpu.models.vm import VmSpec
from pvegpu.plan.doctor import (
    hook_status,
    mapping_health,
    mmio_window,
    numa_layout,
    privileges_findings,
    token_check,
)
from pvegpu.plan.mapping import plan_mappings
from pvegpu.plan.mmio import MmioWindow
from pvegpu.plan.node import NodeObserved, NodePlan, plan_node
from tests.unit.hostdata import RTX, two_cards

NODE = {"name": "pve1", "gpus": {"ids": [RTX], "count": 2}, "profile": "vm"}
VM = {"vmid": 100, "name": "llm", "cores": 4, "memory": 8192}
TOKEN = {"backend": "https", "token_id": "pvegpu@pve!deploy", "token_file": "/t", "root_ssh": False}
MAPPINGS = "PCI mappings of VM 100 (llm) on node pve1"
FIX = "(`pyinfra inventory.py deploy/vm.py` fixes it)"
WRAPPER = "/var/lib/vz/snippets/pvegpu-hook"
BUNDLE = "/usr/local/lib/pvegpu/pvegpu-hook.pyz"


def node_plan(**data: Any) -> NodePlan:
    specs = host_specs({"node": NODE, "vm": VM, **data})
    observed = NodeObserved(two_cards("vfio-pci"), CpuKernel("amd", (6, 8)))
    return plan_node("pve1", specs, frozenset({PVE_NODES}), observed)


def vm_spec(**fields: Any) -> VmSpec:
    return VmSpec.model_validate({**VM, **fields})


def test_noop_no_token_check_without_an_https_token() -> None:
    assert token_check(node_plan()) is None


def test_token_check_names_who_writes_root_only_keys_and_the_paths_to_read() -> None:
    check = token_check(node_plan(pve=TOKEN))
    assert check is not None
    assert (check.token_id, check.root_writer, len(check.required)) == (
        "pvegpu@pve!deploy",
        "nobody (pve.root_ssh: false)",
        32,
    )
    assert check.paths == (
        "/vms/100", "/storage/local-lvm", "/storage/local", "/mapping/pci/gpu0", "/mapping/pci/gpu1",
        "/sdn/zones/localnetwork/vmbr0", "/nodes/pve1", "/",
    )  # fmt: skip
    rooted = token_check(node_plan(pve={**TOKEN, "root_ssh": True}))
    assert rooted is not None
    assert rooted.root_writer == "root's pvesh over SSH (pve.root_ssh)"


def test_privileges_all_held_missing_and_not_read() -> None:
    check = token_check(node_plan(pve=TOKEN))
    assert check is not None
    writer = Finding("keys only root@pam may set are written by nobody (pve.root_ssh: false)")
    held = {path: frozenset(p.name for p in check.required if p.path == path) for path in check.paths}
    assert privileges_findings(check, held) == (
        writer,
        Finding("API token pvegpu@pve!deploy: holds all 32 privileges pvegpu needs on 8 paths"),
    )
    lacking = {**held, "/vms/100": held["/vms/100"] - {"VM.Allocate"}}
    assert privileges_findings(check, lacking) == (
        writer,
        Finding(
            "API token pvegpu@pve!deploy: lacks 1 of the 32 privileges pvegpu needs (README, Security: the "
            "pveum recipe grants them):\n  VM.Allocate on /vms/100: create and destroy the VMs and "
            "containers it manages",
            warning=True,
        ),
    )
    assert privileges_findings(check, NotRead("403 Permission check failed")) == (
        writer,
        Finding(
            "API token pvegpu@pve!deploy: privileges not read: 403 Permission check failed", warning=True
        ),
    )


def mapped(plan: NodePlan) -> tuple[PciMapping, ...]:
    return plan_mappings({"pve1": plan.topology}, plan.mapping_prefix)


def test_mapping_health_valid_is_info_with_one_line_per_gpu() -> None:
    plan = node_plan()
    assert mapping_health(plan, mapped(plan)) == (
        Finding(f"{MAPPINGS}: valid\n  gpu0 pve1: valid\n  gpu1 pve1: valid"),
    )


def test_drift_mapping_health_unmarked_renumbering_is_hardware_changed_with_the_rebuild() -> None:
    plan = node_plan()
    gpu0, gpu1 = mapped(plan)
    moved = replace(gpu1, map=(gpu1.map[0].replace("0000:51:00", "0000:71:00"),))
    assert mapping_health(plan, (gpu0, moved)) == (
        Finding(
            f"{MAPPINGS}: hardware changed (check the hardware, then run `pyinfra inventory.py "
            "deploy/rebuild_vm.py`)\n  gpu0 pve1: valid\n  gpu1 pve1: 0000:71:00 group 24 -> 0000:51:00 "
            "group 24 is a renumbering, but mapping gpu1 is not pvegpu's (no pvegpu mark; mapping.adopt: "
            "true adopts it)",
            warning=True,
        ),
    )


def test_error_mapping_health_none_yet_and_not_read_are_warnings() -> None:
    plan = node_plan()
    assert mapping_health(plan, ()) == (
        Finding(f"{MAPPINGS}: none (gpu<N>) yet; `pyinfra inventory.py deploy/vm.py` creates them", True),
    )
    assert mapping_health(plan, NotRead("pve1: no address")) == (
        Finding(f"{MAPPINGS}: not read: pve1: no address", True),
    )


def test_noop_hook_off_and_installed_and_current() -> None:
    off = vm_spec(self_heal="off")
    assert hook_status(off, HookRead(None)) == (Finding("pre-start hook of VM 100 (vm.self_heal off): off"),)
    current = HookRead(
        "local:snippets/pvegpu-hook", (NodeFile(WRAPPER, "a", "a"), NodeFile(BUNDLE, "b", "b"))
    )
    assert hook_status(vm_spec(), current) == (
        Finding("pre-start hook of VM 100 (vm.self_heal repair): installed and current"),
    )


def test_drift_hook_problems_each_named_with_the_fix() -> None:
    still = hook_status(vm_spec(self_heal="off"), HookRead("local:snippets/pvegpu-hook"))
    assert still == (
        Finding(
            "pre-start hook of VM 100 (vm.self_heal off): the VM still runs pvegpu's hookscript "
            f"local:snippets/pvegpu-hook {FIX}",
            warning=True,
        ),
    )
    read = HookRead(None, (NodeFile(WRAPPER, None, "a"), NodeFile(BUNDLE, "old", "b")), "1.2.3")
    assert hook_status(vm_spec(), read) == (
        Finding(
            "pre-start hook of VM 100 (vm.self_heal repair): the VM's hookscript is not set; "
            f"{WRAPPER} is missing; {BUNDLE} is not pvegpu 1.2.3's {FIX}",
            warning=True,
        ),
    )


def test_error_hook_not_read() -> None:
    assert hook_status(vm_spec(), NotRead("500 storage 'local' does not exist")) == (
        Finding(
            "pre-start hook of VM 100 (vm.self_heal repair): not read: 500 storage 'local' does not exist",
            True,
        ),
    )


def test_numa_layout_and_mmio_window_or_why_not() -> None:
    plan = node_plan()
    assert numa_layout(plan) == (
        Finding("VM NUMA layout flat (default: the host has 0 NUMA node(s)): sockets: 1, cores: 4"),
    )
    assert numa_layout(replace(plan, numa=None, numa_problem="vm.numa_layout host: one NUMA node")) == (
        Finding("VM NUMA layout: vm.numa_layout host: one NUMA node", True),
    )
    assert mmio_window(plan) == ()
    window = MmioWindow(1 << 35, 65536, "", 46, guest="a 64 GiB window")
    assert mmio_window(replace(plan, mmio=window)) == (Finding("VM 100: a 64 GiB window"),)
    assert mmio_window(replace(plan, mmio=replace(window, problem="too small"))) == (
        Finding("VM 100: vm.mmio: too small", True),
    )
