"""What a lab VM start boots (lab/pve/hypervisor.py): nothing without a system on the boot disk or with
OVMF and no EFI system partition; refusals before any guest starts; the guest agent's answers
(lab/pve/agent.py). The booting path itself is the lab tier's (tests/lab/test_lab_cloud_guest.py)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from lab import images
from lab.hosts import LabHost
from lab.pve import agent, hypervisor

DISK = "var/lib/pvegpu-lab/volumes/local-lvm/vm-100-disk-0"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LabHost:
    monkeypatch.setenv("PVEGPU_LAB_RUN", str(tmp_path))
    host = LabHost("pve1", "netns", "reference", 3, 1, 1, "ssh-ed25519 AAAA", "/sys", "/proc/cmdline")
    (host.root / DISK).parent.mkdir(parents=True)
    (host.state_dir / "host.json").write_text(json.dumps(asdict(host)))
    return host


def _start(disk: bool = True, bios: str = "ovmf", ipconfig0: str = "ip=dhcp") -> dict[str, Any]:
    cloud_init = {
        "user_data": "#cloud-config\n",
        "ipconfig0": ipconfig0,
        "hostname": "llm",
        "mac": "BC:24:11:00:00:01",
    }
    return {
        "action": "start",
        "vmid": 100,
        "machine": "q35",
        "bios": bios,
        "devices": [],
        "disk": {"key": "scsi0", "volume": "local-lvm:vm-100-disk-0", "path": f"/{DISK}"} if disk else None,
        "cloud_init": cloud_init,
    }


@pytest.mark.usefixtures("node")
def test_no_disk_boots_nothing() -> None:
    assert hypervisor.handle("pve1", _start(disk=False), "nspawn") == {
        "ok": True,
        "pid": os.getpid(),
        "guest": None,
    }


def test_empty_disk_boots_nothing(node: LabHost) -> None:
    (node.root / DISK).write_bytes(b"")
    assert hypervisor.handle("pve1", _start(), "nspawn") == {"ok": True, "pid": os.getpid(), "guest": None}


def test_ovmf_needs_an_efi_system_partition(node: LabHost) -> None:
    images.write_image(node.root / DISK, images.ImageMeta("debian-12", esp=False, cloud_init=False))
    assert hypervisor.handle("pve1", _start(), "nspawn") == {"ok": True, "pid": os.getpid(), "guest": None}


def test_unroutable_address_refused_before_a_guest_starts(node: LabHost) -> None:
    images.write_image(node.root / DISK, images.CATALOGUE["debian-12-genericcloud-amd64.qcow2"])
    answer = hypervisor.handle("pve1", _start(ipconfig0="ip=10.0.0.5/24,gw=10.0.0.1"), "nspawn")
    assert answer == {
        "ok": False,
        "error": "ipconfig0: ip=10.0.0.5/24 is not a lab address (10.200.<1-250>.2/24)",
    }
    assert sorted(p.name for p in node.state_dir.iterdir()) == ["host.json", "merged"]


@pytest.mark.usefixtures("node")
def test_agent_not_running_without_a_guest() -> None:
    request = {"action": "agent", "vmid": 100, "command": "get-fsinfo", "params": {}}
    assert hypervisor.handle("pve1", request, "nspawn") == {
        "ok": False,
        "error": "QEMU guest agent is not running",
    }


def test_agent_interfaces_on_i440fx_without_a_mac() -> None:
    assert agent.interfaces("pc", None, "10.200.9.2")["result"][1] == {
        "name": "ens18",
        "ip-addresses": [{"ip-address": "10.200.9.2", "ip-address-type": "ipv4", "prefix": 24}],
    }


def test_agent_fsinfo_with_esp() -> None:
    disk = {
        "bus-type": "scsi",
        "bus": 0,
        "target": 0,
        "unit": 0,
        "pci-controller": {"domain": 0, "bus": 0, "slot": 5, "function": 0},
        "serial": "0QEMU_QEMU_HARDDISK_drive-scsi0",
    }
    assert agent.fsinfo(esp=True) == {
        "result": [
            {
                "name": "sda15",
                "mountpoint": "/boot/efi",
                "type": "vfat",
                "disk": [{**disk, "dev": "/dev/sda15"}],
            },
            {"name": "sda1", "mountpoint": "/", "type": "ext4", "disk": [{**disk, "dev": "/dev/sda1"}]},
        ]
    }
    assert [fs["mountpoint"] for fs in agent.fsinfo(esp=False)["result"]] == ["/"]
