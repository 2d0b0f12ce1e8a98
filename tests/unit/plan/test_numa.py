"""plan/numa.py: the VM's NUMA layout from the hardware fact, on the lab's boxes (lab.fakesys trees read back
by the real hardware command: the reference box is 2 sockets, 32 cores + SMT each, 4 GPUs per NUMA node) and
on hand-made variants of them; and how plan/vm.py converges its keys."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.hardware import HostHardware, NumaNode
from pvegpu.models.node import GpuSelector
from pvegpu.models.vm import VmSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.mmio import MmioWindow
from pvegpu.plan.numa import cpuset, plan_numa
from pvegpu.plan.topology import GpuCard, plan_topology
from pvegpu.plan.vm import create_keys, diff_vm, vm_config

Box = tuple[HostHardware, tuple[GpuCard, ...]]
SPEC = VmSpec(vmid=100, cores=32, memory=262144)


def box(tmp_path_factory: pytest.TempPathFactory, topology: str) -> Box:
    root = tmp_path_factory.mktemp(topology) / "sys"
    write_tree(root, topology)
    hardware = read_hardware_locally(root)
    return hardware, plan_topology(hardware, GpuSelector(ids=("10de:2bb1",))).gpus


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Box:
    return box(tmp_path_factory, "reference")


def test_lab_tree_has_the_reference_nodes(reference: Box) -> None:
    hardware, gpus = reference
    assert hardware.numa_nodes == (
        NumaNode(0, (*range(0, 32), *range(64, 96))),
        NumaNode(1, (*range(32, 64), *range(96, 128))),
    )
    assert [gpu.numa_node for gpu in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_create_reference_default_is_host(reference: Box) -> None:
    plan = plan_numa(SPEC, *reference)
    assert plan.reason == "default: the host has 2 NUMA nodes; the VM's GPUs sit on node0, node1"
    assert plan.keys() == {
        "sockets": "2",
        "cores": "16",
        "numa0": "cpus=0-15,hostnodes=0,memory=131072,policy=bind",
        "numa1": "cpus=16-31,hostnodes=1,memory=131072,policy=bind",
        "affinity": "1-31,33-127",
    }


def test_create_reference_with_hugepages_splits_whole_pages(reference: Box) -> None:
    plan = plan_numa(SPEC.model_copy(update={"memory": 263168, "hugepages": "1024"}), *reference)
    assert [(node.value, node.page_mib, node.pages) for node in plan.nodes] == [
        ("cpus=0-15,hostnodes=0,memory=132096,policy=bind", 1024, 129),
        ("cpus=16-31,hostnodes=1,memory=131072,policy=bind", 1024, 128),
    ]


def test_create_any_hugepages_per_node_like_proxmox(reference: Box) -> None:
    """`any`: 1 GiB pages when the node's memory is whole GiB, else 2 MiB (Memory.pm hugepages_size)."""
    plan = plan_numa(SPEC.model_copy(update={"memory": 2050, "hugepages": "any"}), *reference)
    assert [(node.memory_mib, node.page_mib) for node in plan.nodes] == [(1026, 2), (1024, 1024)]


def test_create_gpus_of_one_node_only(reference: Box) -> None:
    hardware, gpus = reference
    reserved = SPEC.model_copy(update={"host_reserved_cores": (32, 33, 96)})
    assert plan_numa(reserved, hardware, gpus[4:]).keys() == {
        "sockets": "1",
        "cores": "32",
        "numa0": "cpus=0-31,hostnodes=1,memory=262144,policy=bind",
        "affinity": "34-63,97-127",
    }


def test_create_without_a_root_path_gets_no_affinity(reference: Box) -> None:
    """Only root@pam may set `affinity` (qemu-server API2/Qemu.pm); numaN need VM.Config.CPU only. A token
    with pve.root_ssh sets it through root (root_user root@pam: the plans above); without, none."""
    plan = plan_numa(SPEC, *reference, root_user=None)
    assert plan.reason == (
        "default: the host has 2 NUMA nodes; the VM's GPUs sit on node0, node1; "
        "no affinity: only root@pam can set it, and pvegpu has no root path to the node"
    )
    assert plan.keys() == {
        "sockets": "2",
        "cores": "16",
        "numa0": "cpus=0-15,hostnodes=0,memory=131072,policy=bind",
        "numa1": "cpus=16-31,hostnodes=1,memory=131072,policy=bind",
    }


def test_create_missing_gpu_box_is_still_two_nodes(tmp_path_factory: pytest.TempPathFactory) -> None:
    hardware, gpus = box(tmp_path_factory, "reference-missing-gpu")
    assert [gpu.numa_node for gpu in gpus] == [0, 0, 0, 1, 1, 1, 1]
    assert (
        plan_numa(SPEC, hardware, gpus).keys()["numa1"] == "cpus=16-31,hostnodes=1,memory=131072,policy=bind"
    )


def test_create_four_nodes_nps4_like(reference: Box) -> None:
    """Four host nodes of 16 CPUs, two GPUs each: four guest nodes, a remainder MiB to numa0."""
    hardware, gpus = reference
    nodes = tuple(NumaNode(n, tuple(range(16 * n, 16 * n + 16))) for n in range(4))
    four = tuple(replace(gpu, numa_node=index // 2) for index, gpu in enumerate(gpus))
    plan = plan_numa(SPEC.model_copy(update={"memory": 65539}), replace(hardware, numa_nodes=nodes), four)
    assert plan.keys() == {
        "sockets": "4",
        "cores": "8",
        "numa0": "cpus=0-7,hostnodes=0,memory=16385,policy=bind",
        "numa1": "cpus=8-15,hostnodes=1,memory=16385,policy=bind",
        "numa2": "cpus=16-23,hostnodes=2,memory=16385,policy=bind",
        "numa3": "cpus=24-31,hostnodes=3,memory=16384,policy=bind",
        "affinity": "1-15,17-31,33-47,49-63",
    }


def test_noop_flat_when_asked_or_without_nodes(reference: Box) -> None:
    flat = plan_numa(SPEC.model_copy(update={"numa_layout": "flat"}), *reference)
    assert (flat.reason, flat.keys()) == ("vm.numa_layout: flat", {"sockets": "1", "cores": "32"})
    hardware, gpus = reference
    one_node = plan_numa(SPEC, replace(hardware, numa_nodes=hardware.numa_nodes[:1]), gpus)
    assert (one_node.layout, one_node.reason) == ("flat", "default: the host has 1 NUMA node(s)")
    no_numa = plan_numa(SPEC.model_copy(update={"numa": False}), *reference)
    assert (no_numa.layout, no_numa.reason) == ("flat", "default: vm.numa is false")
    unknown = plan_numa(SPEC, hardware, tuple(replace(gpu, numa_node=None) for gpu in gpus))
    assert (unknown.layout, unknown.reason) == ("flat", "default: not every GPU knows its NUMA node")


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (
            {"cores": 33},
            "vm.cores: 33 vCPUs do not split evenly over the 2 NUMA nodes holding the VM's GPUs "
            "(nodes 0, 1): give a multiple of 2",
        ),
        (
            {"memory": 65537, "hugepages": "2"},
            "vm.memory: 65537 MiB is not a whole number of 2 MiB hugepages (vm.hugepages: 2)",
        ),
        (
            {"memory": 1024, "hugepages": "1024"},
            "vm.memory: 1024 MiB gives a NUMA node no whole 1024 MiB hugepage",
        ),
        (
            {"host_reserved_cores": tuple(range(128))},
            "vm.host_reserved_cores: leaves no CPU of the GPUs' NUMA nodes (0, 1) for the VM",
        ),
    ],
)
def test_error_layouts_that_cannot_be_built(reference: Box, update: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match="^" + re.escape(message) + "$"):
        plan_numa(SPEC.model_copy(update=update), *reference)


def test_error_host_without_gpu_nodes(reference: Box) -> None:
    hardware, gpus = reference
    spec = SPEC.model_copy(update={"numa_layout": "host"})
    with pytest.raises(
        PlanError, match=r"^vm.numa_layout: host needs every GPU's NUMA node; sysfs numa_node is -1 for gpu0$"
    ):
        plan_numa(spec, hardware, (replace(gpus[0], numa_node=None), *gpus[1:]))
    with pytest.raises(PlanError, match=r"^vm.numa_layout: host: the GPUs' NUMA node 1 has no CPUs in "):
        plan_numa(spec, replace(hardware, numa_nodes=hardware.numa_nodes[:1]), gpus)


def test_error_hugepages_from_node_ten(reference: Box) -> None:
    hardware, gpus = reference
    nodes = (*hardware.numa_nodes, NumaNode(10, (200, 201)))
    far = (*gpus[:1], replace(gpus[1], numa_node=10))
    with pytest.raises(
        PlanError, match=r"^vm.hugepages: Proxmox takes hugepages only from host NUMA nodes 0-9"
    ):
        plan_numa(SPEC.model_copy(update={"hugepages": "2"}), replace(hardware, numa_nodes=nodes), far)


def test_host_layout_needs_numa() -> None:
    with pytest.raises(ValueError, match="numa_layout: host needs numa: true"):
        VmSpec(vmid=100, numa=False, numa_layout="host")


@pytest.mark.parametrize(
    ("cpus", "text"),
    [((0,), "0"), ((0, 1, 2, 3, 8, 10, 11), "0-3,8,10-11"), ((5, 7), "5,7"), (tuple(range(1, 128)), "1-127")],
)
def test_cpuset_is_proxmox_short_string(cpus: tuple[int, ...], text: str) -> None:
    assert cpuset(cpus) == text


# --- plan/vm.py: the keys converge like the others ------------------------------------------------------

ARGS = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"
WINDOW = MmioWindow(bar_bytes=1 << 40, window_mib=262144, args=ARGS, phys_bits=46)


def test_vm_config_carries_the_layout(reference: Box) -> None:
    plan = plan_numa(SPEC, *reference)
    config = vm_config(SPEC, ("gpu0", "gpu1"), None, plan)
    assert {key: config[key] for key in ("sockets", "cores", "numa", "numa0", "numa1", "affinity")} == {
        "sockets": "2",
        "cores": "16",
        "numa": "1",
        "numa0": "cpus=0-15,hostnodes=0,memory=131072,policy=bind",
        "numa1": "cpus=16-31,hostnodes=1,memory=131072,policy=bind",
        "affinity": "1-31,33-127",
    }


def test_update_from_flat_then_noop(reference: Box) -> None:
    flat = vm_config(SPEC, ("gpu0",), None)
    host = vm_config(SPEC, ("gpu0",), None, plan_numa(SPEC, *reference))
    current: dict[str, object] = {
        **flat,
        "sockets": 1,
        "cores": 32,
        "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
    }
    current |= {"efidisk0": "x", "scsi0": "y"}
    change = diff_vm(host, create_keys(SPEC), current, "gpu")
    assert change.set == {
        "sockets": "2",
        "cores": "16",
        "numa0": "cpus=0-15,hostnodes=0,memory=131072,policy=bind",
        "numa1": "cpus=16-31,hostnodes=1,memory=131072,policy=bind",
        "affinity": "1-31,33-127",
    }
    assert change.delete == ()
    assert not diff_vm(host, create_keys(SPEC), current | change.set, "gpu").changed


def test_update_deletes_numa_keys_no_longer_planned(reference: Box) -> None:
    """Back to flat (or fewer GPU nodes): pvegpu's numaN go, an affinity is left as it is."""
    host = vm_config(SPEC, ("gpu0",), None, plan_numa(SPEC, *reference))
    current: dict[str, object] = {**host, "numa7": "cpus=0,memory=16", "net0": "virtio,bridge=vmbr0"}
    current |= {"efidisk0": "x", "scsi0": "y"}
    flat = vm_config(SPEC, ("gpu0",), None)
    change = diff_vm(flat, create_keys(SPEC), current, "gpu")
    assert change.set == {"sockets": "1", "cores": "32"}
    assert change.delete == ("numa0", "numa1", "numa7")


def test_update_args_keeps_the_operators_parts(reference: Box) -> None:
    host = vm_config(SPEC, ("gpu0",), WINDOW, plan_numa(SPEC, *reference))
    operator = "-msg timestamp=on"  # not a part pvegpu writes
    current: dict[str, object] = {**host, "args": f"{operator} {ARGS}", "net0": "virtio,bridge=vmbr0"}
    current |= {"efidisk0": "x", "scsi0": "y"}
    assert not diff_vm(host, create_keys(SPEC), current, "gpu").changed
    stale = {**current, "args": f"{operator} -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"}
    assert diff_vm(host, create_keys(SPEC), stale, "gpu").set == {"args": f"{operator} {ARGS}"}
