"""deploy/vm.py's NUMA layout against a Proxmox lab node (pvesh stand-in): on the reference box (2 sockets,
4 GPUs per NUMA node) the VM's config file has exactly the numaN, affinity, sockets/cores, hugepages and
`args` keys planned (pvegpu/plan/numa.py), the stand-in starts it (Memory.pm's NUMA checks pass), an
operator's own `args` part is kept beside pvegpu's MMIO window, and a second run changes nothing.

It reaches the node through the `ssh` backend (root's pvesh for every call), so that backend stays tested
beside the lab's default (`https` with the token, root-only keys through root's pvesh).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import boot, hosts
from lab.pve import node as pve_node
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.node import GpuSelector
from pvegpu.plan.mmio import passed_functions, plan_mmio
from pvegpu.plan.topology import plan_topology
from tests.lab.test_lab_vm import (
    DISK,
    KNOWN,
    PENDING,
    START,
    STORAGE,
    SYNC,
    UNCHANGED,
    USER_DATA,
    VM,
    VM_INVENTORY,
    Cli,
    Ssh,
    prepare_host,
    run,
)

pytestmark = pytest.mark.lab

MEMORY = 8192
CLIQUE = "-msg timestamp=on"  # an operator's own part of `args` (no part pvegpu writes)
BAD_PART = "-set device.hostpci0.0.rombar=0"  # an operator's part QEMU refuses


@pytest.fixture(autouse=True)
def ssh_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PVEGPU_LAB_PVE_BACKEND", "ssh")


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"n{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def vm_conf(node: hosts.LabHost) -> dict[str, str]:
    """The VM's config as its next start sees it: the main section with [PENDING] values over it."""
    sections: dict[str, dict[str, str]] = {"": {}}
    current = ""
    for line in (node.root / "etc/pve/qemu-server/100.conf").read_text().splitlines():
        if line.startswith("["):
            current = line
            sections[current] = {}
        elif ": " in line and not line.startswith("#"):
            key, _, value = line.partition(": ")
            sections[current][key] = value
    return sections[""] | sections.get("[PENDING]", {})


def test_vm_numa_layout_host_on_the_reference_box(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    vm_data = {"self_heal": "off", "cores": 8, "memory": MEMORY, "hugepages": "1024"}
    monkeypatch.setenv("PVEGPU_LAB_VM_DATA", json.dumps(vm_data))
    node = pve_node.up(pve_name, "reference")
    boot.install(node, "grub")
    prepare_host(pyinfra_cli, monkeypatch, node)
    hardware = read_hardware_locally(node.root / node.sysfs_root.lstrip("/"))
    gpus = plan_topology(hardware, GpuSelector(ids=("10de:2bb1",))).gpus
    mmio = plan_mmio(passed_functions(hardware, gpus), MEMORY).args

    first, _ = run(pyinfra_cli, "deploy/vm.py", node)

    assert {first[key] for key in (SYNC, STORAGE, USER_DATA, VM, DISK, START, KNOWN)} == {"success"}
    conf = vm_conf(node)
    assert {key: value for key, value in conf.items() if key.startswith("numa")} == {
        "numa": "1",
        "numa0": "cpus=0-3,hostnodes=0,memory=4096,policy=bind",
        "numa1": "cpus=4-7,hostnodes=1,memory=4096,policy=bind",
    }
    assert {key: conf[key] for key in ("sockets", "cores", "memory", "affinity", "hugepages", "args")} == {
        "sockets": "2",
        "cores": "4",
        "memory": str(MEMORY),
        "affinity": "1-31,33-127",
        "hugepages": "1024",
        "args": mmio,
    }

    # The operator adds a part of their own to `args` (pending: the VM runs); pvegpu keeps it, and its cold
    # restart (pve_host.allow_reboot) applies it; the next run changes nothing.
    lab_ssh(node, f"pvesh set /nodes/{pve_name}/qemu/100/config --args '{CLIQUE} {mmio}'")
    again, _ = run(pyinfra_cli, "deploy/vm.py", node)

    assert again == UNCHANGED | {PENDING: "success"}
    assert run(pyinfra_cli, "deploy/vm.py", node)[0] == UNCHANGED
    assert vm_conf(node)["args"] == f"{CLIQUE} {mmio}"
    assert Path(node.root / "etc/pve/qemu-server/100.conf").read_text().count("numa0: ") == 1

    monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(tmp_path))
    doctor = pyinfra_cli("-y", "--limit", pve_name, VM_INVENTORY, "deploy/doctor.py", check=False)
    assert doctor.returncode == 0, doctor.stderr
    # pyinfra pads `[host]` to the inventory's longest name.
    layout = [
        line.split("] ", 1)[1].lstrip() for line in doctor.stderr.splitlines() if "VM NUMA layout" in line
    ]
    assert layout == [
        "VM NUMA layout host (default: the host has 2 NUMA nodes; the VM's GPUs sit on node0, node1): "
        "sockets: 2, cores: 4, numa0: cpus=0-3,hostnodes=0,memory=4096,policy=bind, "
        "numa1: cpus=4-7,hostnodes=1,memory=4096,policy=bind, affinity: 1-31,33-127"
    ]

    # An operator's part QEMU refuses (a dotted id: `-set` reads device `hostpci0`, property `0.rombar`, and
    # the multifunction slot's devices are `hostpci0.0`, `hostpci0.1`): pvegpu keeps it, its cold restart
    # fails with QEMU's own message, said in one line naming the VM and the part; the VM stays down.
    lab_ssh(node, f"pvesh set /nodes/{pve_name}/qemu/100/config --args '{BAD_PART} {mmio}'")
    refused = pyinfra_cli("-y", "--limit", pve_name, VM_INVENTORY, "deploy/vm.py", check=False)

    assert refused.returncode != 0
    said = [line.split("] ", 1)[1].strip() for line in refused.stderr.splitlines() if "no device" in line]
    assert said == [
        f'VM 100 did not start: kvm: {BAD_PART}: there is no device "hostpci0" defined '
        "(start failed: QEMU exited with code 1)"
    ]
    assert not (node.root / "var/run/qemu-server/100.pid").exists()
    assert vm_conf(node)["args"] == f"{BAD_PART} {mmio}"
