"""NCCL environment and SGLang flags per profile, with their reasons; operator overrides; vm refusals.

The lxc/baremetal cases read the lab's reference box (2-socket EPYC, 8 GPUs, gpu0-3 on NUMA node 0, gpu4-7 on
node 1, a ConnectX NIC) through the real hardware fact and topology planner.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.facts.nccl_conf import parse_nccl_conf
from pvegpu.models.hardware import HostHardware, PciFunction
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.nccl import EnvSetting, FlagSetting, conf_file_problems, has_infiniband, plan_nccl
from pvegpu.plan.sglang import plan_sglang_argv
from pvegpu.plan.topology import Topology, plan_vendor_topology

PXB = "NCCL's default (PXB) would fall back to SHM between root complexes"
DEBUG = "# log each channel's transport (P2P, SHM, NET) so pvegpu's doctor can check it"
NO_IB = "# no InfiniBand/RoCE adapter: skip NCCL's IB probe, use sockets between nodes"
SHM = "the SHM path's throughput at high concurrency (experimental until measured on this box)"
SHM_CONNECTIONS = (
    f"# 64 CUDA work queues (CUDA's default 8) so NCCL's kernels overlap: {SHM}",
    "CUDA_DEVICE_MAX_CONNECTIONS=64",
)
SHM_BUFFERS = (f"# 8 MiB buffers per channel (NCCL's default 4 MiB): {SHM}", "NCCL_BUFFSIZE=8388608")
SHM_CHANNELS = (f"# 32 channels over shared memory: {SHM}", "NCCL_MIN_NCHANNELS=32")
P2P_OFF = (
    "# P2P between the VM's GPUs is not proven (vm.p2p); without this NCCL's AMD rule lets 2-GPU groups "
    "(TP4+PP2's pipeline pairs) try it",
    "NCCL_P2P_DISABLE=1",
)
P2P_LL = (
    "# LL buffers for send/recv over the network transport (pipeline stages across nodes), as the "
    "reference box's recipe sets (NCCL's default 0)",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS=1",
)
P2P_CHANNELS = (
    "# 8 channels: the reference box's 8-GPU all-reduce reached 37.6-41 GB/s (22 by default)",
    "NCCL_MIN_NCHANNELS=8",
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[HostHardware, Topology]:
    sysfs = tmp_path_factory.mktemp("reference")
    write_tree(sysfs, "reference")
    hardware = read_hardware_locally(Path(sysfs))
    return hardware, plan_vendor_topology(hardware, "10de")


def on_numa(topology: Topology, *nodes: int | None) -> Topology:
    return replace(
        topology, gpus=tuple(replace(gpu, numa_node=n) for gpu, n in zip(topology.gpus, nodes, strict=True))
    )


def test_create_vm_shm_only_flags_and_reasons() -> None:
    plan = plan_nccl("vm", None, infiniband=False)
    assert plan.argv == ("--enable-p2p-check", "--disable-custom-all-reduce")
    assert plan.env_file_lines() == (
        *SHM_CONNECTIONS,
        *SHM_BUFFERS,
        DEBUG,
        "NCCL_DEBUG=INFO",
        NO_IB,
        "NCCL_IB_DISABLE=1",
        *SHM_CHANNELS,
        *P2P_OFF,
        "# sglang --enable-p2p-check: P2P is not supported between passed-through GPUs; "
        "without the check SGLang assumes it works",
        "# sglang --disable-custom-all-reduce: SGLang's custom all-reduce needs P2P, which the VM lacks; "
        "NCCL all-reduces over shared memory",
    )


def test_vm_env_never_enables_p2p(reference: tuple[HostHardware, Topology]) -> None:
    plan = plan_nccl("vm", reference[1], infiniband=True)
    assert [(setting.name, setting.value) for setting in plan.env] == [
        ("CUDA_DEVICE_MAX_CONNECTIONS", "64"),
        ("NCCL_BUFFSIZE", "8388608"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_MIN_NCHANNELS", "32"),
        ("NCCL_P2P_DISABLE", "1"),
    ]


def test_vm_guest_topology_file_is_pointed_at() -> None:
    plan = plan_nccl("vm", None, infiniband=True, topo_file="/etc/pvegpu/nccl-topo.xml")
    assert plan.env_file_lines()[10:12] == (
        "# the GPUs' host NUMA nodes and PCIe links, which the VM hides (experimental until measured)",
        "NCCL_TOPO_FILE=/etc/pvegpu/nccl-topo.xml",
    )


def test_create_baremetal_two_sockets_sys(reference: tuple[HostHardware, Topology]) -> None:
    hardware, topology = reference
    assert [gpu.numa_node for gpu in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert has_infiniband(hardware)  # the reference box's ConnectX (15b3, RoCE)
    plan = plan_nccl("baremetal", topology, infiniband=has_infiniband(hardware))
    assert plan.flags == ()
    assert plan.env_file_lines() == (
        *P2P_LL,
        DEBUG,
        "NCCL_DEBUG=INFO",
        *P2P_CHANNELS,
        f"# GPUs on NUMA nodes 0, 1: allow P2P across the CPU interconnect ({PXB})",
        "NCCL_P2P_LEVEL=SYS",
    )


@pytest.mark.parametrize(
    ("nodes", "level", "reason"),
    [
        ((0,) * 8, "PHB", f"all GPUs on NUMA node 0: allow P2P through the CPU's host bridges ({PXB})"),
        ((None,) * 8, "PHB", f"all GPUs on one NUMA node: allow P2P through the CPU's host bridges ({PXB})"),
        ((1, 1, 1, 1, 1, 1, 1, None), "SYS",
         f"GPUs on NUMA nodes 1, unknown: allow P2P across the CPU interconnect ({PXB})"),
    ],
)  # fmt: skip
def test_create_lxc_level_from_numa_nodes(
    reference: tuple[HostHardware, Topology], nodes: tuple[int | None, ...], level: str, reason: str
) -> None:
    plan = plan_nccl("lxc", on_numa(reference[1], *nodes), infiniband=False)
    assert plan.env[-1] == EnvSetting("NCCL_P2P_LEVEL", level, reason)
    assert [setting.name for setting in plan.env] == [
        "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
        "NCCL_DEBUG",
        "NCCL_IB_DISABLE",
        "NCCL_MIN_NCHANNELS",
        "NCCL_P2P_LEVEL",
    ]


def test_update_operator_overrides_are_shown(reference: tuple[HostHardware, Topology]) -> None:
    plan = plan_nccl(
        "baremetal",
        reference[1],
        infiniband=False,
        overrides={"NCCL_P2P_LEVEL": "PHB", "NCCL_MIN_NCHANNELS": "16", "NCCL_DEBUG": "WARN"},
    )
    assert plan.env_file_lines() == (
        *P2P_LL,
        "# set by the operator (sglang.env), replacing the planned INFO "
        "(log each channel's transport (P2P, SHM, NET) so pvegpu's doctor can check it)",
        "NCCL_DEBUG=WARN",
        NO_IB,
        "NCCL_IB_DISABLE=1",
        "# set by the operator (sglang.env), replacing the planned 8 (8 channels: the reference box's 8-GPU "
        "all-reduce reached 37.6-41 GB/s (22 by default))",
        "NCCL_MIN_NCHANNELS=16",
        "# set by the operator (sglang.env), replacing the planned SYS "
        f"(GPUs on NUMA nodes 0, 1: allow P2P across the CPU interconnect ({PXB}))",
        "NCCL_P2P_LEVEL=PHB",
    )


def test_vm_allows_overrides_that_keep_p2p_off() -> None:
    plan = plan_nccl("vm", None, infiniband=False, overrides={"NCCL_P2P_DISABLE": "0x1", "NCCL_PROTO": "LL"})
    assert [(s.name, s.value) for s in plan.env] == [
        ("CUDA_DEVICE_MAX_CONNECTIONS", "64"),
        ("NCCL_BUFFSIZE", "8388608"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_IB_DISABLE", "1"),
        ("NCCL_MIN_NCHANNELS", "32"),
        ("NCCL_P2P_DISABLE", "0x1"),  # strtol reads 1
        ("NCCL_PROTO", "LL"),
    ]


@pytest.mark.parametrize("value", ["0", "2", "", "yes", "08"])
def test_error_vm_refuses_a_p2p_disable_nccl_does_not_read_as_1(value: str) -> None:
    with pytest.raises(PlanError) as caught:
        plan_nccl("vm", None, infiniband=False, overrides={"NCCL_P2P_DISABLE": value})
    assert str(caught.value) == (
        f"sglang.env.NCCL_P2P_DISABLE: refused in the vm profile: {value!r} is not 1 to NCCL, so it lets "
        "NCCL try P2P, which the VM's probe has not proven (vm.p2p)"
    )
    # once the probe proved P2P, the operator may turn it off again
    proven = plan_nccl("vm", None, infiniband=False, p2p=True, overrides={"NCCL_P2P_DISABLE": value})
    assert ("NCCL_P2P_DISABLE", value) in [(s.name, s.value) for s in proven.env]


def test_error_vm_refuses_p2p_forcing_overrides() -> None:
    overrides = {
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_IGNORE_DISABLED_P2P": "2",
        "NCCL_PROTO": "LL",
        "NCCL_CONF_FILE": "/srv/nccl.conf",
    }
    with pytest.raises(PlanError) as caught:
        plan_nccl("vm", None, infiniband=False, overrides=overrides)
    assert str(caught.value).splitlines() == [
        "sglang.env.NCCL_CONF_FILE: refused in the vm profile: NCCL fills every variable the environment "
        "leaves unset from that file, so it could set what the vm profile refuses",
        "sglang.env.NCCL_IGNORE_DISABLED_P2P: refused in the vm profile: it makes NCCL skip or hide its P2P "
        "check; forced P2P in a VM hangs or corrupts data (NVIDIA/nccl #2335)",
        "sglang.env.NCCL_P2P_LEVEL: refused in the vm profile: it lets NCCL try P2P, "
        "which passed-through GPUs do not support",
        "sglang.env.NCCL_SHM_DISABLE: refused in the vm profile: the VM's GPUs talk through shared memory; "
        "without it NCCL falls back to sockets",
        "sglang.env.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: refused in the vm profile: "
        "the PCIe-IPC all-reduce needs CUDA P2P, which the VM does not support",
    ]


def test_same_overrides_are_allowed_on_baremetal(reference: tuple[HostHardware, Topology]) -> None:
    plan = plan_nccl("baremetal", reference[1], infiniband=True, overrides={"NCCL_IGNORE_DISABLED_P2P": "1"})
    assert ("NCCL_IGNORE_DISABLED_P2P", "1") in [(s.name, s.value) for s in plan.env]


@pytest.mark.parametrize("profile", ["lxc", "baremetal"])
def test_error_p2p_profiles_need_gpus(profile: str) -> None:
    empty = Topology(gpus=(), order_key="numa node, root bus, bus address", problems=())
    for topology in (None, empty):
        with pytest.raises(PlanError) as caught:
            plan_nccl(profile, topology, infiniband=False)  # type: ignore[arg-type]
        assert str(caught.value) == f"sglang: the {profile} profile needs the host's GPUs for NCCL_P2P_LEVEL"


def function(vendor: str, class_code: int) -> PciFunction:
    return PciFunction(
        address="0000:c1:00.0",
        vendor=vendor,
        device="1017",
        subsystem_vendor=vendor,
        subsystem_device="0001",
        class_code=class_code,
        driver=None,
        iommu_group=None,
        numa_node=None,
        root_bus="0000:c0",
    )


@pytest.mark.parametrize(
    ("vendor", "class_code", "expected"),
    [("15b3", 0x020700, True), ("8086", 0x020700, True), ("15b3", 0x020000, True), ("8086", 0x020000, False)],
)
def test_has_infiniband(vendor: str, class_code: int, expected: bool) -> None:
    hardware = HostHardware(functions=(function(vendor, class_code),), iommu_present=False)
    assert has_infiniband(hardware) is expected


def test_vm_flags_pass_the_sglang_option_table() -> None:
    plan = plan_nccl("vm", None, infiniband=False)
    assert plan.flags[0] == FlagSetting(
        "--enable-p2p-check",
        "P2P is not supported between passed-through GPUs; without the check SGLang assumes it works",
    )
    argv = plan_sglang_argv(SglangSpec(), 8, plan.argv)
    assert argv[-3:] == ("--enable-metrics", "--enable-p2p-check", "--disable-custom-all-reduce")


def test_error_vm_refuses_a_conf_file_line_nccl_would_apply() -> None:
    etc = parse_nccl_conf("# site\nNCCL_SOCKET_IFNAME=eth0\nNCCL_P2P_LEVEL=SYS\nNCCL_SHM_DISABLE = 1\n")
    home = parse_nccl_conf(
        "NCCL_IGNORE_DISABLED_P2P=1\nNCCL_CONF_FILE=/x\nSGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"
    )
    files = {"/var/lib/sglang/.nccl.conf": home, "/etc/nccl.conf": etc}
    plan = plan_nccl("vm", None, infiniband=False)
    assert conf_file_problems("vm", plan, files) == (
        "/var/lib/sglang/.nccl.conf:1: NCCL_IGNORE_DISABLED_P2P is refused in the vm profile: it makes NCCL "
        "skip or hide its P2P check; forced P2P in a VM hangs or corrupts data (NVIDIA/nccl #2335) (NCCL "
        "reads this file for every variable the service's environment leaves unset; remove the line)",
        "/etc/nccl.conf:3: NCCL_P2P_LEVEL is refused in the vm profile: it lets NCCL try P2P, which "
        "passed-through GPUs do not support (NCCL reads this file for every variable the service's "
        "environment leaves unset; remove the line)",
    )  # `NCCL_SHM_DISABLE = 1` names `NCCL_SHM_DISABLE ` to NCCL; the last two are not NCCL's to set


def test_a_conf_file_line_the_environment_sets_is_moot() -> None:
    files = {"/etc/nccl.conf": parse_nccl_conf("NCCL_P2P_LEVEL=NVL\n"), "/var/lib/sglang/.nccl.conf": None}
    assert conf_file_problems("vm", plan_nccl("vm", None, infiniband=False, p2p=True), files) == ()
    assert conf_file_problems("baremetal", plan_nccl("vm", None, infiniband=False), files) == ()
