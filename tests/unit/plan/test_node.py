"""plan.node: one plan per host (specs, topology, the profile's functions, mapping ids, vfio/MMIO plans, the
VM's plan and the profile's steps), and plan.profile's steps by profile and group."""

from __future__ import annotations

from typing import Any

import pytest

from pvegpu.models.boot import CpuKernel
from pvegpu.models.groups import BAREMETAL_HOSTS, LXC_GUESTS, PVE_NODES, VM_GUESTS
from pvegpu.models.hardware import HostHardware
from pvegpu.models.specs import host_specs
from pvegpu.models.vm import VmSpec
from pvegpu.plan.mmio import mmio_refusal
from pvegpu.plan.node import NodeObserved, plan_node
from pvegpu.plan.profile import NodeSteps, ServingSteps, node_steps, serving_steps
from pvegpu.plan.reboot import Ours, RebootGuard
from pvegpu.plan.vm import VmPlan, storages_used
from tests.unit.hostdata import RTX, two_cards

BOTH = ("0000:41:00.0", "0000:41:00.1", "0000:51:00.0", "0000:51:00.1")
NODE = {"name": "pve1", "gpus": {"ids": [RTX], "count": 2}}
VM = {"vmid": 100, "name": "llm", "cores": 4, "memory": 8192}
AMD_6_8 = CpuKernel("amd", (6, 8))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5HcbcUQrpSUxW4nw/rMoAjNHG/aykHEZ6M+9fVDl2P you@desk"


def data(profile: str = "vm", **more: Any) -> dict[str, Any]:
    return {"node": {**NODE, "profile": profile}, **more}


def test_create_vm_node_plan_holds_topology_functions_ids_vfio_mmio_and_steps() -> None:
    plan = plan_node(
        "pve1", host_specs(data(vm=VM)), frozenset({PVE_NODES}), NodeObserved(two_cards("vfio-pci"), AMD_6_8)
    )
    assert [gpu.name for gpu in plan.topology.gpus] == ["gpu0", "gpu1"]
    assert plan.functions == BOTH
    assert plan.mapping_ids == ("gpu0", "gpu1")
    assert plan.host is not None
    assert plan.host.tokens == ("amd_iommu=on", "iommu=pt")
    assert plan.vfio is not None
    assert (plan.vfio.functions, plan.vfio.ids) == (BOTH, ("10de:22e8", RTX))
    assert plan.steps == NodeSteps(
        park_container=False,
        park_vm=False,
        park_host_driver=True,
        vm=True,
        host_driver=False,
        container=False,
        waiting=None,
    )
    assert (plan.serving, plan.problem, plan.passable_problem()) == (None, None, None)
    # the inventory's VM is pvegpu's; no driver of the node's own to keep with the `vm` profile
    assert plan.reboot_guard == RebootGuard("pve1", Ours("pve1", (("VM", 100),)), False, None)


def test_noop_serving_host_is_planned_from_its_hardware_alone() -> None:
    plan = plan_node("llm", host_specs(data()), frozenset({VM_GUESTS}), NodeObserved(two_cards()))
    assert (plan.host, plan.vfio, plan.steps, plan.functions) == (None, None, None, ())
    assert plan.reboot_guard is None
    assert plan.serving == ServingSteps(driver="guest", sglang=True)
    assert len(plan.topology.gpus) == 2


@pytest.mark.parametrize(
    ("pve", "expected"),
    [({"owner": "ops", "cluster": "dc1"}, "ops"), ({"cluster": "dc1"}, "dc1"), ({}, "pve1")],
)
def test_plan_owner_is_pve_owner_else_cluster_else_node_name(pve: dict[str, str], expected: str) -> None:
    plan = plan_node(
        "pve1", host_specs(data(pve=pve)), frozenset({PVE_NODES}), NodeObserved(two_cards(), AMD_6_8)
    )
    assert plan.owner == expected


def test_error_a_selector_matching_nothing_is_the_plans_problem_naming_the_field() -> None:
    specs = host_specs({"node": {"name": "pve1", "gpus": {"ids": ["10de:ffff"]}}})
    plan = plan_node("pve1", specs, frozenset({PVE_NODES}), NodeObserved(two_cards(), AMD_6_8))
    assert plan.problem == "node.gpus.ids: 10de:ffff matches no display function on this host"
    assert plan.passable_problem() == "no display function has id 10de:ffff"


def test_error_a_proxmox_node_is_never_planned_without_its_cpu_and_kernel() -> None:
    with pytest.raises(ValueError, match="Proxmox node pve1 is planned without its CPU and kernel"):
        plan_node("pve1", host_specs(data()), frozenset({PVE_NODES}), NodeObserved(two_cards()))


def test_held_switch_waits_and_says_why() -> None:
    specs = host_specs(data("baremetal", pve_host={"allow_reboot": False}))
    groups = frozenset({PVE_NODES, BAREMETAL_HOSTS})
    plan = plan_node("pve1", specs, groups, NodeObserved(two_cards("vfio-pci"), AMD_6_8))
    waiting = (
        f"profile baremetal: {', '.join(BOTH)} still bound to vfio-pci until the host reboots "
        "(pve_host.allow_reboot is false): not installing the host driver or serving yet"
    )
    assert plan.steps == NodeSteps(
        park_container=False,
        park_vm=True,
        park_host_driver=False,
        vm=False,
        host_driver=False,
        container=False,
        waiting=waiting,
    )
    assert plan.serving == ServingSteps(driver=None, sglang=False)


@pytest.mark.parametrize(
    ("profile", "has_container", "expected"),
    [
        ("vm", True, NodeSteps(True, False, True, True, False, False, None)),
        ("lxc", True, NodeSteps(False, True, True, False, True, True, None)),
        ("baremetal", False, NodeSteps(False, True, False, False, True, False, None)),
    ],
)
def test_node_steps_by_profile(profile: str, has_container: bool, expected: NodeSteps) -> None:
    assert node_steps(profile, has_container=has_container, waiting=None) == expected


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ({VM_GUESTS}, ServingSteps("guest", True)),
        ({LXC_GUESTS}, ServingSteps("container", True)),
        ({BAREMETAL_HOSTS}, ServingSteps("guest", True)),
        ({BAREMETAL_HOSTS, PVE_NODES}, ServingSteps(None, True)),
        ({PVE_NODES}, None),
        (set(), None),
    ],
)
def test_serving_steps_by_group(groups: set[str], expected: ServingSteps | None) -> None:
    assert serving_steps(frozenset(groups), None) == expected


def vm_plan(specs_data: dict[str, Any], hardware: HostHardware | None = None) -> VmPlan:
    plan = plan_node(
        "pve1", host_specs(specs_data), frozenset({PVE_NODES}), NodeObserved(hardware or two_cards(), AMD_6_8)
    )
    assert plan.vm is not None
    return plan.vm


def test_create_vm_plan_holds_config_create_keys_clique_storages_and_what_is_unbound() -> None:
    vm = vm_plan(data(vm=VM))
    clique = "-set device.hostpci0.x-nv-gpudirect-clique=0 -set device.hostpci1.x-nv-gpudirect-clique=0"
    assert (vm.spec.vmid, vm.clique, vm.problem) == (100, clique, None)
    assert (vm.config["hostpci0"], vm.config["hostpci1"]) == ("mapping=gpu0,pcie=1", "mapping=gpu1,pcie=1")
    assert "args" not in vm.config  # vm.p2p off (the default), no MMIO window for these BARs
    assert vm.config["hookscript"] == "local:snippets/pvegpu-hook"
    assert vm.create == {
        "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=0",
        "scsi0": "local-lvm:200,iothread=1",
        "net0": "virtio,bridge=vmbr0",
    }
    assert vm.storages == {"local": ["snippets"]}
    assert vm.unbound == (
        "0000:41:00.0 (nvidia)",
        "0000:41:00.1 (snd_hda_intel)",
        "0000:51:00.0 (nvidia)",
        "0000:51:00.1 (snd_hda_intel)",
    )
    assert vm_plan(data(vm=VM), two_cards("vfio-pci")).unbound == ()


def test_create_vm_plan_sets_the_clique_in_args_with_p2p_on() -> None:
    vm = vm_plan(data(vm={**VM, "p2p": "on"}))
    assert vm.config["args"] == vm.clique != ""


def test_noop_no_vm_plan_without_vm_data_nor_off_a_proxmox_node() -> None:
    node = plan_node("pve1", host_specs(data()), frozenset({PVE_NODES}), NodeObserved(two_cards(), AMD_6_8))
    guest = plan_node("llm", host_specs(data(vm=VM)), frozenset({VM_GUESTS}), NodeObserved(two_cards()))
    assert (node.vm, guest.vm) == (None, None)


def test_error_vm_plan_problem_names_the_gpus_that_cannot_be_passed_first() -> None:
    selector = {"name": "pve1", "profile": "vm", "gpus": {"ids": ["10de:ffff"]}}
    vm = vm_plan({"node": selector, "vm": VM})
    assert vm.problem == "the GPUs cannot be passed: no display function has id 10de:ffff"


def test_error_vm_plan_problem_refuses_mmio_args_without_a_root_path() -> None:
    pve = {"backend": "https", "token_id": "pvegpu@pve!deploy", "token_file": "/t", "root_ssh": False}
    vm = vm_plan(data(vm={**VM, "mmio": "args"}, pve=pve))
    assert vm.problem == mmio_refusal("args", None) is not None


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (None, {}),
        ({"volume": "local:import/debian-12.qcow2"}, {"local": ["snippets"]}),
        (
            {"url": "https://images.example/debian-12.qcow2", "checksum": "ab" * 64, "storage": "images"},
            {"local": ["snippets"], "images": ["import"]},
        ),
        (
            {"url": "https://images.example/debian-12.qcow2", "checksum": "ab" * 64, "storage": "local"},
            {"local": ["import", "snippets"]},
        ),
    ],
)
def test_storages_used_name_the_content_types_the_vm_needs(
    image: dict[str, str] | None, expected: dict[str, list[str]]
) -> None:
    spec = VmSpec.model_validate({"vmid": 100, "self_heal": "off", "image": image, "ssh_public_keys": [KEY]})
    assert storages_used(spec) == expected


def test_update_retired_tokens_are_those_pvegpu_owned_and_the_profile_no_longer_wants() -> None:
    owned = ("intel_iommu=on", "iommu=pt", "vfio-pci.ids=10de:2bb1")
    observed = NodeObserved(two_cards("vfio-pci"), AMD_6_8, owned_tokens=owned)
    plan = plan_node("pve1", host_specs(data(vm=VM)), frozenset({PVE_NODES}), observed)
    assert plan.host is not None
    assert plan.host.tokens == ("amd_iommu=on", "iommu=pt")
    assert plan.retired == ("intel_iommu=on", "vfio-pci.ids=10de:2bb1")
    guest = plan_node(
        "llm", host_specs(data()), frozenset({VM_GUESTS}), NodeObserved(two_cards(), None, owned)
    )
    assert guest.retired == ()
