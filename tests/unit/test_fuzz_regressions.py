"""Inputs the parser fuzzer (scripts/fuzz.py) found crashing a parser with an exception other than its parse
error, each now a regular case with the exact outcome. The crashes were of two kinds: `str.isdigit()` takes
digits `int()` refuses (`²`), and `int()` refuses a number of 4300+ digits (Python's limit)."""

from __future__ import annotations

import hashlib
import json

import pytest

from pvegpu.facts.cpu import parse_cpu_kernel
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.host_checks import parse_host_checks
from pvegpu.facts.lxc_devices import parse_nvidia_nodes
from pvegpu.facts.nccl import parse_transports
from pvegpu.facts.nvidia import parse_nvidia_smi
from pvegpu.facts.pve_files import qemu_config_answer
from pvegpu.facts.secret_files import parse_secret_files
from pvegpu.models.lxc import LxcSpec
from pvegpu.models.pve import MapEntryError, parse_map_entry
from pvegpu.models.vm import VmSpec
from pvegpu.plan.bench import parse_results
from pvegpu.plan.errors import PlanError
from pvegpu.plan.hostpci import HostPciError
from pvegpu.plan.lxc import LxcDevices, container_config, diff_container
from pvegpu.plan.vm import create_keys, diff_vm, vm_config

LONG = "1" * 5000  # past int()'s 4300 digits
RESULT = {
    "max_concurrency": 4, "completed": 16, "output_throughput": 812.5, "request_throughput": 0.79,
    "median_ttft_ms": 210.0, "p99_ttft_ms": 480.2, "median_itl_ms": 4.9,
}  # fmt: skip


def host_checks(interrupts: str, cpuidle: str) -> list[str]:
    return ["#pvegpu:interrupts", interrupts, "#pvegpu:cpuidle", cpuidle, "#pvegpu:numa", "#pvegpu:config",
            "#pvegpu:iommu_types", "#pvegpu:end"]  # fmt: skip


def test_error_map_entry_iommugroup_too_long_for_a_group() -> None:
    with pytest.raises(MapEntryError) as error:
        parse_map_entry(f"node=pve1,path=0000:41:00.0,id=10de:2bb1,iommugroup={LONG}")
    assert str(error.value) == "iommugroup: 5000 characters: an IOMMU group number has at most 18"


def test_error_host_checks_count_or_state_number_not_plain_digits() -> None:
    state = "/sys/devices/system/cpu/cpu0/cpuidle/state0/name:C1"
    with pytest.raises(FactParseError) as error:
        parse_host_checks(host_checks("²", state))
    assert str(error.value) == "interrupts: expected one count, got ['²']"
    long_state = f"/sys/devices/system/cpu/cpu0/cpuidle/state{LONG}/name:C1"
    with pytest.raises(FactParseError) as error:
        parse_host_checks(host_checks("612", long_state))
    assert str(error.value) == f"line 4: expected .../cpuidle/stateN/name|disable:VALUE, got {long_state!r}"


def test_nccl_line_with_a_number_nccl_never_prints_is_not_a_channel() -> None:
    assert (
        parse_transports([f"h:1:1 [0] NCCL INFO Channel 01/{LONG} : 0[0] -> 1[1] via P2P/CUMEM/read"]) == ()
    )


@pytest.mark.parametrize("head", ["file 0 99999999999999999999 22 1 0 0 0", "file ² 600 22 1 0 0 0"])
def test_error_secret_file_mode_not_octal_or_uid_not_ascii(head: str) -> None:
    with pytest.raises(FactParseError) as error:
        parse_secret_files([f"{head}\t/k"])
    assert str(error.value) == f"secret file state: unexpected line {head + chr(9) + '/k'!r}"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (json.dumps({**RESULT, "max_concurrency": float("nan")}),
         "benchmark result line 1: max_concurrency is nan, not an integer"),
        (json.dumps({**RESULT, "completed": "16"}),
         "benchmark result line 1: completed is '16', not an integer"),
        (json.dumps({**RESULT, "median_itl_ms": None}),
         "benchmark result line 1: median_itl_ms is None, not a number"),
        (json.dumps({**RESULT, "max_concurrency": True}),
         "benchmark result line 1: max_concurrency is True, not an integer"),
        (json.dumps(RESULT).replace("0.79", LONG),
         "benchmark result line 1: not a result object (Exceeds the limit (4300 digits) for integer string "
         "conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit)"),
    ],
)  # fmt: skip
def test_error_bench_result_of_the_wrong_type(line: str, message: str) -> None:
    with pytest.raises(PlanError) as error:
        parse_results([line], 1024)
    assert str(error.value) == message


def test_error_kernel_release_number_too_long() -> None:
    with pytest.raises(FactParseError) as error:
        parse_cpu_kernel([f"{LONG}.8.12-4-pve"])
    assert (
        str(error.value) == f"uname -r: expected a release like 6.8.12-4-pve, got {[LONG + '.8.12-4-pve']!r}"
    )


def test_proc_devices_line_with_a_non_ascii_major_is_not_a_device() -> None:
    lines = [
        "#pvegpu:caps",
        "#pvegpu:devices",
        "Character devices:",
        "195 nvidia",
        "² nvidia-uvm",
        "#pvegpu:end",
    ]
    assert parse_nvidia_nodes(lines).majors == {"nvidia": 195}


def test_nvidia_smi_index_too_long_is_reported_as_its_output() -> None:
    line = f"{LONG}, NVIDIA H200, 00000000:00:06.0, 580.159.04"
    smi = parse_nvidia_smi([line])
    assert (smi.gpus, smi.error) == ((), line)


def test_container_dev_key_with_a_number_proxmox_never_writes_is_left_alone() -> None:
    spec = LxcSpec(vmid=200, ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst")
    config = container_config(spec, LxcDevices({"dev0": "/dev/nvidia0"}, ()))
    current = {**config, "dev1": "/dev/nvidia1", f"dev{LONG}": "/dev/nvidia2"}
    assert diff_container(config, current).delete == ("dev1",)


def test_error_vm_slot_holding_a_mapping_number_pvegpu_never_writes() -> None:
    spec = VmSpec(vmid=100, name="llm", cores=64, memory=786432)
    # A Q35/OVMF VM (an i440FX one is not given hostpci keys before its conversion: plan/convert.py).
    current = {"machine": "q35", "bios": "ovmf", "hostpci0": f"mapping=gpu{LONG},pcie=1"}
    with pytest.raises(HostPciError) as error:
        diff_vm(vm_config(spec, ["gpu0"], None), create_keys(spec), current, "gpu")
    assert str(error.value) == (
        f"hostpci0 holds {current['hostpci0']!r}, which is not a gpu<N> mapping: free the slot first"
    )


def test_vm_config_integer_too_long_is_not_modelled() -> None:
    """`sockets: <5000 digits>` in a VM config file: no answer (the API is asked), not a ValueError."""
    assert qemu_config_answer(f"cores: 1\nsockets: {LONG}\n".encode()) is None
    assert qemu_config_answer(b"sockets: +0002\n") == {
        "sockets": 2,
        "digest": hashlib.sha1(b"sockets: +0002\n").hexdigest(),
    }
