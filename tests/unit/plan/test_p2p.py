"""`vm.p2p` (pvegpu/plan/p2p.py): cliques on the lab topologies (read through the real hardware fact), the
clique parts of `args` merged beside the operator's parts and the MMIO window, the probe's verdict for every
failure kind, the record, and the NCCL plan it switches (pvegpu/plan/nccl.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.p2p import Identity, Record
from pvegpu.models.vm import VmSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.mmio import MmioWindow
from pvegpu.plan.nccl import P2P_CHECK_PROVEN, P2P_LEVEL_PROVEN, FlagSetting, plan_nccl
from pvegpu.plan.p2p import (
    clique_args,
    clique_devices,
    crash_failure,
    guest_uses_p2p,
    judge,
    own_clique,
    plan_cliques,
    single_function_gpus,
    timeout_failure,
    vm_devices,
)
from pvegpu.plan.topology import Topology, plan_vendor_topology
from pvegpu.plan.vm import cpu_hidden, create_keys, diff_vm, merge_args, vm_config

MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
OPERATOR = "-msg timestamp=on -set device.gpu9.x-nv-gpudirect-clique=0"  # the operator's: no hostpciN part
WINDOW = MmioWindow(bar_bytes=1 << 40, window_mib=1048576, args=MMIO, phys_bits=46)
EIGHT = " ".join(f"-set device.hostpci{n}.x-nv-gpudirect-clique=0" for n in range(8))
OLD_EIGHT = " ".join(f"-set device.hostpci{n}.0.x-nv-gpudirect-clique=0" for n in range(8))  # never started


def topology_of(tmp_path_factory: pytest.TempPathFactory, name: str) -> Topology:
    sysfs = tmp_path_factory.mktemp(name)
    write_tree(sysfs, name)
    return plan_vendor_topology(read_hardware_locally(Path(sysfs)), "10de")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    return topology_of(tmp_path_factory, "reference")


def test_create_reference_amd_one_clique_of_every_gpu(reference: Topology) -> None:
    """Each GPU on its own root complex; AMD's data fabric carries P2P between them."""
    assert plan_cliques(reference, "amd") == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert clique_args(plan_cliques(reference, "amd")) == EIGHT


def test_create_reference_not_amd_no_clique(reference: Topology) -> None:
    assert plan_cliques(reference, "intel") == ()
    assert clique_args(()) == ""


def test_create_switches_one_clique_per_root_complex(tmp_path_factory: pytest.TempPathFactory) -> None:
    switches = topology_of(tmp_path_factory, "switches")
    cliques = plan_cliques(switches, "intel")
    assert cliques == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert clique_args(cliques) == (
        "-set device.hostpci0.x-nv-gpudirect-clique=0 -set device.hostpci1.x-nv-gpudirect-clique=0 "
        "-set device.hostpci2.x-nv-gpudirect-clique=1 -set device.hostpci3.x-nv-gpudirect-clique=1 "
        "-set device.hostpci4.x-nv-gpudirect-clique=2 -set device.hostpci5.x-nv-gpudirect-clique=2 "
        "-set device.hostpci6.x-nv-gpudirect-clique=3 -set device.hostpci7.x-nv-gpudirect-clique=3"
    )


def test_update_clique_parts_replaced_operator_and_mmio_kept() -> None:
    current = f"{OPERATOR} {MMIO} -set device.hostpci3.x-nv-gpudirect-clique=4"
    assert merge_args(current, None, EIGHT) == f"{OPERATOR} {MMIO} {EIGHT}"
    assert merge_args(current, None, None) == current
    assert own_clique(current) == "-set device.hostpci3.x-nv-gpudirect-clique=4"
    assert own_clique(OPERATOR) == ""
    assert merge_args(current, None, "") == f"{OPERATOR} {MMIO}"
    assert merge_args(f"{MMIO} {OPERATOR}", None, EIGHT) == f"{OPERATOR} {MMIO} {EIGHT}"


def test_update_the_earlier_dotted_form_is_pvegpus_and_replaced() -> None:
    """`hostpciN.0.x-nv-...` (an earlier pvegpu's, which QEMU reads as device hostpciN, property
    `0.x-nv-...`): recognised as pvegpu's, so `on` replaces it and `off` removes it; it names no GPU to pass
    single-function."""
    current = f"{OPERATOR} {OLD_EIGHT} {MMIO}"
    assert own_clique(current) == OLD_EIGHT
    assert merge_args(current, None, EIGHT) == f"{OPERATOR} {MMIO} {EIGHT}"
    assert merge_args(current, None, "") == f"{OPERATOR} {MMIO}"
    assert clique_devices(current) == frozenset()
    assert clique_devices(f"{OPERATOR} {EIGHT}") == frozenset(range(8))


@pytest.mark.parametrize(
    ("mode", "args", "single"),
    [
        ("on", None, frozenset(range(8))),  # the planned clique, whatever the config holds
        ("probe", None, frozenset()),  # no clique set by the probe (yet, or any more)
        ("probe", f"{OPERATOR} -set device.hostpci2.x-nv-gpudirect-clique=0", frozenset({2})),
        ("probe", OLD_EIGHT, frozenset()),  # the dotted form: the probe replaces it
        ("off", EIGHT, frozenset()),  # the whole-slot paths come back
    ],
)
def test_single_function_gpus_follow_the_clique(mode: str, args: str | None, single: frozenset[int]) -> None:
    assert single_function_gpus(mode, EIGHT, args) == single  # type: ignore[arg-type]


def test_noop_probe_mode_leaves_the_clique_to_the_probe() -> None:
    """`probe`: vm_config plans only the MMIO part; a clique the probe set survives the converge."""
    spec = VmSpec(vmid=100, p2p="probe", self_heal="off")
    config = vm_config(spec, ["gpu0", "gpu1"], WINDOW, None, "-set device.hostpci0.x-nv-gpudirect-clique=0")
    assert config["args"] == MMIO
    current: dict[str, object] = {**config, **create_keys(spec), "args": f"{OPERATOR} {MMIO} {EIGHT}"}
    assert diff_vm(config, create_keys(spec), current, "gpu", keep_clique=True).set == {}
    assert diff_vm(config, create_keys(spec), current, "gpu").set == {"args": f"{OPERATOR} {MMIO}"}


def test_update_on_mode_sets_the_clique_beside_the_operator_and_mmio() -> None:
    spec = VmSpec(vmid=100, p2p="on", self_heal="off")
    config = vm_config(spec, ["gpu0"], WINDOW, None, EIGHT)
    assert config["args"] == f"{MMIO} {EIGHT}"
    current: dict[str, object] = {**config, **create_keys(spec), "args": f"{MMIO} {OPERATOR}"}
    change = diff_vm(config, create_keys(spec), current, "gpu")
    assert change.set == {"args": f"{OPERATOR} {MMIO} {EIGHT}"}
    assert not diff_vm(config, create_keys(spec), current | change.set, "gpu").changed


@pytest.mark.parametrize(
    ("mmio", "current", "change"),
    [
        ("args", f"{OPERATOR} {MMIO} {EIGHT}", {"args": f"{OPERATOR} {MMIO}"}),
        ("phys-bits", f"{OPERATOR} {EIGHT}", {"args": OPERATOR}),
    ],
)
def test_update_off_removes_only_pvegpus_clique_parts(
    mmio: str, current: str, change: dict[str, str]
) -> None:
    spec = VmSpec(vmid=100, mmio=mmio, self_heal="off")
    config = vm_config(spec, ["gpu0"], WINDOW, None, EIGHT)
    values: dict[str, object] = {**config, **create_keys(spec), "args": current}
    assert diff_vm(config, create_keys(spec), values, "gpu").set == change
    assert not diff_vm(config, create_keys(spec), values | change, "gpu").changed


def test_update_off_deletes_args_that_held_only_pvegpus_clique() -> None:
    spec = VmSpec(vmid=100, mmio="phys-bits", self_heal="off")
    config = vm_config(spec, ["gpu0"], WINDOW, None, EIGHT)
    values: dict[str, object] = {**config, **create_keys(spec), "args": EIGHT}
    change = diff_vm(config, create_keys(spec), values, "gpu")
    assert (change.set, change.delete) == ({}, ("args",))


def test_update_on_mode_with_phys_bits_args_is_the_clique_only() -> None:
    spec = VmSpec(vmid=100, p2p="on", mmio="phys-bits", self_heal="off")
    assert vm_config(spec, ["gpu0"], WINDOW, None, EIGHT)["args"] == EIGHT
    assert "args" not in vm_config(spec.model_copy(update={"p2p": "off"}), ["gpu0"], WINDOW, None, EIGHT)


PASS: dict[str, Any] = {
    "gpus": 2,
    "pairs": [
        {"a": 0, "b": 1, "peer": {"ab": True, "ba": True}, "copy": {"ab": True, "ba": True}},
    ],
    "allreduce": {
        "p2p": {
            "ranks": [{"rank": 0, "ok": True}, {"rank": 1, "ok": True}],
            "latency_us": 3,
            "busbw_gbs": 40,
        },
        "shm": {
            "ranks": [{"rank": 0, "ok": True}, {"rank": 1, "ok": True}],
            "latency_us": 13,
            "busbw_gbs": 20,
        },
    },
}
SUMMARY = "all-reduce latency 3.0 us with P2P vs 13.0 us with SHM, bus bandwidth 40.0 GB/s vs 20.0 GB/s"


def changed(**paths: Any) -> dict[str, Any]:
    """PASS with `a__b__c=value` set at result[a][b][c] (a list index as digits)."""
    result = copy.deepcopy(PASS)
    for path, value in paths.items():
        *parents, last = path.split("__")
        node: Any = result
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value
    return result


def test_judge_pass() -> None:
    assert judge(PASS).verdict == "p2p"
    assert judge(PASS).failures == ()
    assert judge(PASS).summary == SUMMARY


@pytest.mark.parametrize(
    ("result", "failure"),
    [
        (changed(pairs__0__peer__ba=False), "GPU 0 <-> GPU 1: no peer access 1->0"),
        (changed(pairs__0__copy__ab=False), "GPU 0 <-> GPU 1: checksum mismatch copying 0->1"),
        (
            changed(allreduce__p2p__ranks__1__ok=False),
            "NCCL all-reduce over P2P: wrong result on rank 1",
        ),
        (
            changed(allreduce__shm={"error": "rank 0 did not finish within 120 s (hang)"}),
            "NCCL all-reduce over SHM: rank 0 did not finish within 120 s (hang)",
        ),
        (
            changed(allreduce__p2p__latency_us=20),
            "P2P does not beat SHM: all-reduce latency 20.0 us with P2P vs 13.0 us with SHM, "
            "bus bandwidth 40.0 GB/s vs 20.0 GB/s",
        ),
        (
            changed(allreduce__p2p__busbw_gbs=10),
            "P2P does not beat SHM: all-reduce latency 3.0 us with P2P vs 13.0 us with SHM, "
            "bus bandwidth 10.0 GB/s vs 20.0 GB/s",
        ),
        (changed(pairs=[]), "the probe found fewer than 2 GPUs: nothing peers"),
        (changed(allreduce=None), "the probe ran no NCCL all-reduce"),
        ({"pairs": []} | {"gpus": 0}, "the probe's result is malformed (KeyError('allreduce'))"),
    ],
)
def test_error_judge_names_the_failure(result: dict[str, Any], failure: str) -> None:
    judgement = judge(result)
    assert judgement.verdict == "shm"
    assert judgement.failures[-1] == failure


def test_error_pair_failure_needs_no_allreduce() -> None:
    """The probe runs no all-reduce after a pair failed: only the pair is named."""
    judgement = judge(changed(pairs__0__copy__ba=False, allreduce=None))
    assert judgement.failures == ("GPU 0 <-> GPU 1: checksum mismatch copying 1->0",)


def test_error_timeout_and_crash_lines() -> None:
    assert timeout_failure(30) == "the probe did not finish within 30 s and was killed: P2P hangs in this VM"
    assert crash_failure(1, "Traceback\nRuntimeError: CUDA error\n") == (
        "the probe failed (exit status 1): RuntimeError: CUDA error"
    )


IDENTITY = Identity("580.95.05", "6.12.0-1-amd64", "hostpci0=mapping=gpu0,pcie=1; -set x")


def test_record_use() -> None:
    """The record's text and parser: tests/unit/facts/test_p2p_record.py."""
    record = Record("probe", "p2p", IDENTITY, (), SUMMARY)
    assert guest_uses_p2p("probe", record)
    assert not guest_uses_p2p("off", record)
    assert not guest_uses_p2p(None, record)
    assert not guest_uses_p2p("probe", Record("probe", "shm", IDENTITY, ("x",)))
    assert not guest_uses_p2p("probe", None)
    assert guest_uses_p2p("on", None)


def test_vm_devices_in_hostpci_order() -> None:
    config = {"hostpci10": "mapping=gpu10,pcie=1", "hostpci2": "mapping=gpu2,pcie=1", "cores": 4}
    assert vm_devices(config, "C") == "hostpci2=mapping=gpu2,pcie=1; hostpci10=mapping=gpu10,pcie=1; C"


def test_nccl_vm_plan_with_p2p() -> None:
    shm = plan_nccl("vm", None, infiniband=False)
    p2p = plan_nccl("vm", None, infiniband=False, p2p=True)
    assert shm.argv == ("--enable-p2p-check", "--disable-custom-all-reduce")
    assert "NCCL_P2P_LEVEL" not in {setting.name for setting in shm.env}
    assert p2p.flags == (FlagSetting("--enable-p2p-check", P2P_CHECK_PROVEN),)
    assert [(s.name, s.value, s.reason) for s in p2p.env if s.name.startswith("NCCL_P2P")] == [
        ("NCCL_P2P_LEVEL", "SYS", P2P_LEVEL_PROVEN)
    ]
    assert not any(s.name == "NCCL_P2P_DISABLE" for s in p2p.env)


def test_error_nccl_vm_plan_with_p2p_still_refuses_operator_p2p_variables() -> None:
    with pytest.raises(PlanError) as raised:
        plan_nccl("vm", None, infiniband=False, overrides={"NCCL_P2P_LEVEL": "SYS"}, p2p=True)
    assert str(raised.value) == (
        "sglang.env.NCCL_P2P_LEVEL: refused in the vm profile: it lets NCCL try P2P, which passed-through "
        "GPUs do not support"
    )


HIDDEN_NOTE = (
    "cpu host,hidden=1 has hidden=1 (kvm=off), with which the guest's NVIDIA driver ignores the GPUDirect "
    "clique (vm.p2p): pvegpu's cpu value, without hidden, replaces it"
)


@pytest.mark.parametrize(
    ("p2p", "args", "keep_clique", "notes"),
    [
        ("on", MMIO, False, (HIDDEN_NOTE,)),  # the clique is being set
        ("probe", f"{MMIO} {EIGHT}", True, (HIDDEN_NOTE,)),  # the probe's clique is there
        ("probe", MMIO, True, ()),  # no clique (yet): replaced without a word
        ("off", f"{MMIO} {EIGHT}", False, ()),  # the clique leaves with the converge
    ],
)
def test_update_cpu_never_hidden_while_a_clique_is_set(
    p2p: str, args: str, keep_clique: bool, notes: tuple[str, ...]
) -> None:
    spec = VmSpec(vmid=100, p2p=p2p, self_heal="off")
    config = vm_config(spec, ["gpu0"], WINDOW, None, EIGHT)
    current: dict[str, object] = {**config, **create_keys(spec), "args": args, "cpu": "host,hidden=1"}
    change = diff_vm(config, create_keys(spec), current, "gpu", keep_clique=keep_clique)
    assert change.set["cpu"] == "host"
    assert change.notes == notes


@pytest.mark.parametrize(
    ("cpu", "hidden"),
    [
        ("host,hidden=1", True),
        ("host,hidden=on", True),
        ("cputype=host,flags=+pcid,hidden=yes", True),
        ("host,hidden=0", False),
        ("host,phys-bits=46", False),
        (None, False),
    ],
)
def test_cpu_hidden_reads_proxmox_booleans(cpu: str | None, hidden: bool) -> None:
    assert cpu_hidden(cpu) is hidden
