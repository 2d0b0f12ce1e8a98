"""The pvesh stand-in's `numaN`, `affinity` and `hugepages` (lab/pve/pvesh.py), run as a program: the keys are
checked against qemu-server's schema (Memory.pm $numa_fmt, QemuServer.pm `affinity` pve-cpuset, `hugepages`
enum) and a start dies with Memory.pm's texts when the NUMA nodes do not fit the VM or the node. Texts from
proxmox/qemu-server src/PVE/QemuServer/Memory.pm and src/PVE/QemuServer.pm (pve_verify_cpuset)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import fakesys
from tests.unit.lab.pve.test_pvesh import NODE, Pve, Result

VM_ARGS = ("--vmid", "100", "--name", "gpuvm", "--machine", "q35", "--bios", "ovmf")
CREATE_USAGE = "pvesh create <api_path> --vmid <integer> (100 - 999999999) [OPTIONS] [FORMAT_OPTIONS]\n"
LAYOUT = (
    "--numa",
    "1",
    "--memory",
    "8192",
    "--sockets",
    "2",
    "--cores",
    "4",
    "--numa0",
    "cpus=0-3,hostnodes=0,memory=4096,policy=bind",
    "--numa1",
    "cpus=4-7,hostnodes=1,memory=4096,policy=bind",
    "--affinity",
    "1-31,33-127",
    "--hugepages",
    "1024",
)


@pytest.fixture
def pve(tmp_path: Path) -> Pve:
    installed = Pve(tmp_path)
    fakesys.write_tree(installed.sysfs, "reference")  # NUMA nodes 0 and 1
    settings = {"node": NODE, "sysfs_root": str(installed.sysfs), "root": str(installed.root)}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    return installed


def test_create_with_pvegpus_layout_stores_it_and_starts(pve: Pve) -> None:
    assert pve("create", "/nodes/pve1/qemu", *VM_ARGS, *LAYOUT).err == ""
    conf = pve.json("get", "/nodes/pve1/qemu/100/config")
    assert {key: conf[key] for key in ("affinity", "numa0", "numa1", "hugepages", "sockets", "cores")} == {
        "affinity": "1-31,33-127",
        "numa0": "cpus=0-3,hostnodes=0,memory=4096,policy=bind",
        "numa1": "cpus=4-7,hostnodes=1,memory=4096,policy=bind",
        "hugepages": "1024",
        "sockets": 2,
        "cores": 4,
    }
    assert pve("create", "/nodes/pve1/qemu/100/status/start").err == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ("--affinity", "0-3,x"), "affinity: invalid format - unable to parse cpuset option", id="affinity"
        ),
        pytest.param(
            ("--affinity", "8-2"),
            "affinity: invalid format - unable to parse cpuset option",
            id="affinity-range",
        ),
        pytest.param(
            ("--numa0", "hostnodes=0,memory=4096"),
            "numa0.cpus: property is missing and it is not optional",
            id="cpus",
        ),
        pytest.param(
            ("--numa0", "cpus=0-3,policy=strict"),
            "numa0.policy: value 'strict' does not have a value in the enumeration "
            "'preferred, bind, interleave'",
            id="policy",
        ),
        pytest.param(
            ("--numa0", "cpus=0-3,hostnodes=0,1"),
            "numa0: invalid format - value without key, but schema does not define a default key",
            id="comma-hostnodes",
        ),
        pytest.param(
            ("--hugepages", "4"),
            "hugepages: value '4' does not have a value in the enumeration 'any, 2, 1024'",
            id="hugepages",
        ),
    ],
)
def test_error_schema(pve: Pve, args: tuple[str, ...], message: str) -> None:
    result = pve("create", "/nodes/pve1/qemu", *VM_ARGS, *args)
    assert result == Result(255, "", f"400 Parameter verification failed.\n{message}\n{CREATE_USAGE}")


def test_error_numa8_is_no_option(pve: Pve) -> None:
    """Proxmox has numa0..numa7 (Memory.pm $MAX_NUMA): pvesh builds its options from the schema."""
    result = pve("create", "/nodes/pve1/qemu", *VM_ARGS, "--numa8", "cpus=0")
    assert result == Result(255, "", f"Unknown option: numa8\n400 unable to parse option\n{CREATE_USAGE}")


@pytest.mark.parametrize(
    ("numa1", "error"),
    [
        ("cpus=4-7,hostnodes=2,memory=4096,policy=bind", "host NUMA node2 doesn't exist"),
        ("cpus=4-7,hostnodes=1,memory=4096", "you need to define a policy for hostnode 1"),
        (
            "cpus=4-7,hostnodes=1,memory=2048,policy=bind",
            "total memory for NUMA nodes must be equal to vm static memory",
        ),
        ("cpus=4-7,hostnodes=1,policy=bind", "missing NUMA node1 memory value"),
    ],
)
def test_error_start_with_memory_pm_texts(pve: Pve, numa1: str, error: str) -> None:
    layout = dict(zip(LAYOUT[::2], LAYOUT[1::2], strict=True)) | {"--numa1": numa1}
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, *(part for pair in layout.items() for part in pair))
    start = pve("create", "/nodes/pve1/qemu/100/status/start")
    assert start.err == error + "\n"
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "stopped"
