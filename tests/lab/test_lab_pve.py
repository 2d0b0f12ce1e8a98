"""A Proxmox lab node: the pvesh stand-in over real SSH, VM start bringing up the Q35 guest lab host of a VM
made as pvegpu makes it (system disk imported from the stand-in cloud image, pvegpu's user-data with its login
and host keys), a BIOS change failing the start with Proxmox's message, and `lab down` removing node,
hypervisor and guest (and the guest keys pvegpu made for it)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import guest_payload, hosts, images
from lab.pve import node as pve_node
from pvegpu.local.guest_keys import (
    GuestPlace,
    ensure_key_pair,
    host_key_files,
    login_key_files,
    record_known_host,
)
from pvegpu.models.vm import ImageVolume, VmSpec
from pvegpu.plan.cloud_init import snippet_name, static_address, user_data
from pvegpu.plan.vm import create_keys

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
Ssh = Callable[[hosts.LabHost, str], str]
Leftovers = Callable[[hosts.LabHost], list[str]]


def map_line(manifest: dict[str, Any], index: int, node: str) -> str:
    """The `map` entry Proxmox's GUI writes for GPU `index` of the node's tree (function-less path)."""
    gpu = manifest["gpus"][index]
    device = manifest["devices"][gpu["functions"][0]]
    return (
        f"path={gpu['address']},node={node},id={device['vendor']}:{device['device']},"
        f"subsystem-id={device['subsystem_vendor']}:{device['subsystem_device']},iommugroup={gpu['iommu_group']}"
    )


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"p{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def _pvesh(node: hosts.LabHost, args: str) -> subprocess.CompletedProcess[str]:
    argv = hosts.ssh_argv(node, f"pvesh {args}")
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)


IMAGE = "debian-12-genericcloud-amd64.qcow2"


def _spec(node: hosts.LabHost) -> VmSpec:
    """VM 100 as inventory/lab.py declares it, its image already downloaded to `local` (done below)."""
    net = node.index + 100
    return VmSpec(
        vmid=100,
        name=f"{node.name}v100",
        image=ImageVolume(volume=f"local:import/{IMAGE}"),
        ipconfig=f"ip=10.200.{net}.2/24,gw=10.200.{net}.1",
    )


def _create_vm_with_8_gpus(node: hosts.LabHost, lab_ssh: Ssh) -> str:
    """Through pvesh, what deploy/vm.py does: the node downloads the cloud image; pvegpu's keys for the guest
    (host key recorded in the lab's known_hosts before first contact), its user-data snippet; 8 GPU mappings;
    VM 100 (q35, OVMF) with the GPUs and the create keys of pvegpu/plan/vm.py. Returns the guest's address."""
    manifest = node.manifest()
    spec = _spec(node)
    lab_ssh(node, "pvesh set /storage/local --content iso,vztmpl,backup,import,snippets")
    url, checksum = images.image_url(node, IMAGE), images.image_checksum(IMAGE)
    lab_ssh(
        node,
        f"pvesh create /nodes/{node.name}/storage/local/download-url --content import --filename {IMAGE} "
        f"--url {url} --checksum {checksum} --checksum-algorithm sha512",
    )
    known_hosts, place = hosts.known_hosts_path(), GuestPlace(None, None, node.name, spec.vmid)
    host_private, host_public = ensure_key_pair(host_key_files(known_hosts, place)[0])
    _, login_public = ensure_key_pair(login_key_files(known_hosts, place)[0])
    address = static_address(spec.ipconfig)
    assert address is not None
    record_known_host(known_hosts, address, host_public)
    snippet = node.root / "var/lib/vz/snippets" / snippet_name(spec.vmid)
    snippet.parent.mkdir(parents=True, exist_ok=True)
    snippet.write_text(user_data(spec, host_private, host_public, login_public))
    snippet.chmod(0o600)
    for index in range(8):
        lab_ssh(
            node,
            f"pvesh create /cluster/mapping/pci --id gpu{index} --map {map_line(manifest, index, node.name)}",
        )
    hostpci = " ".join(f"--hostpci{i} mapping=gpu{i},pcie=1" for i in range(8))
    disks = " ".join(f"--{key} {shlex.quote(value)}" for key, value in create_keys(spec).items())
    lab_ssh(
        node,
        f"pvesh create /nodes/{node.name}/qemu --vmid 100 --name {spec.name} --machine q35 --bios ovmf "
        f"{disks} {hostpci} --output-format json",
    )
    return address


def _status(node: hosts.LabHost, lab_ssh: Ssh) -> str:
    answer = lab_ssh(node, f"pvesh get /nodes/{node.name}/qemu/100/status/current --output-format json")
    status: str = json.loads(answer)["status"]
    return status


def test_vm_start_brings_up_the_q35_guest_then_a_bios_change_keeps_it_down(
    pve_name: str, lab_ssh: Ssh, lab_leftovers: Leftovers
) -> None:
    node = pve_node.up(pve_name, "reference")
    repoid = hashlib.sha1(b"9.0.3").hexdigest()[:8]  # the stand-in's repoid: a hash of its version
    version = lab_ssh(node, "pvesh get /version --output-format json")
    assert version == f'{{"release":"9.0","repoid":"{repoid}","version":"9.0.3"}}\n'
    address = _create_vm_with_8_gpus(node, lab_ssh)

    start = _pvesh(node, f"create /nodes/{node.name}/qemu/100/status/start --output-format json")

    assert (start.returncode, start.stderr) == (0, "")
    upid = rf'"UPID:{node.name}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:qmstart:100:root@pam:"\n'
    assert re.fullmatch(upid, start.stdout), start.stdout
    assert _status(node, lab_ssh) == "running"
    guest = hosts.get_host(f"{node.name}v100")
    assert (pve_node.role_of(node), pve_node.role_of(guest)) == ("pve", "guest")
    assert pve_node.guest_vm(guest) == {
        "node": node.name,
        "vmid": 100,
        "os": "debian-12",
        "esp": True,
        "cloud_init": True,
        "agent": True,
    }
    assert (guest.mode, guest.sysfs_root, hosts.dependents(node.name)) == (
        "nspawn",
        "/opt/fakesys",
        [guest.name],
    )
    # Reached as pyinfra reaches it: pvegpu's login key, the host key pvegpu recorded (lab_ssh -> ssh_argv).
    assert (guest.address, guest.host_key_recorded) == (address, False)
    assert lab_ssh(guest, "hostname") == f"{guest.name}\n"
    listing = lab_ssh(
        guest, "cd /opt/fakesys/bus/pci/devices && for d in *; do echo $d $(cat $d/vendor $d/device); done"
    )
    paths = lab_ssh(
        guest, "cd /opt/fakesys/bus/pci/devices && for d in 0000:0[1-9]:00.0; do readlink $d; done"
    )
    # hostpci0-3 sit behind ich9-pcie-port-1..4 (00:1c.0-3), hostpci4-7 behind qemu-server's ports 00:10.0-3;
    # buses are numbered in devfn order, so 10.x get buses 1-4 and 1c.x buses 5-8.
    ports = [f"10.{n}" for n in range(4)] + [f"1c.{n}" for n in range(4)]
    assert paths == "".join(
        f"../../../devices/pci0000:00/0000:00:{port}/0000:{bus:02x}:00.0\n"
        for bus, port in enumerate(ports, 1)
    )
    gpus = [
        line for line in listing.splitlines() if line.startswith("0000:0") and not line.startswith("0000:00")
    ]
    assert gpus == [
        f"0000:{bus:02x}:00.{fn} 0x10de {dev}"
        for bus in range(1, 9)
        for fn, dev in ((0, "0x2bb1"), (1, "0x22e8"))
    ]
    # The guest carries its software sources (lab.guest_payload) and points them at its fake sysfs.
    settings = lab_ssh(guest, "cat /etc/pvegpu-lab/nvidia.env").splitlines()
    assert settings[1:] == ["SYSFS_ROOT=/opt/fakesys", f"VERSION_FILE={guest_payload.VERSION_FILE}"]
    no_numa_no_groups = (
        "cat /opt/fakesys/bus/pci/devices/0000:05:00.0/numa_node; ls /opt/fakesys/kernel || true"
    )
    assert lab_ssh(guest, no_numa_no_groups) == "-1\n"

    stop = _pvesh(node, f"create /nodes/{node.name}/qemu/100/status/stop --output-format json")

    assert (stop.returncode, stop.stderr) == (0, "")
    assert _status(node, lab_ssh) == "stopped"
    # The guest's host key line is pvegpu's, kept while the VM exists; the lab left nothing of its own.
    assert lab_leftovers(guest) == [f"known_hosts entry for {address}"]
    assert hosts.dependents(node.name) == []

    renumbered = hosts.retopo(node.name, "reference-renumbered").manifest()
    group = renumbered["devices"]["0000:41:00.0"]["iommu_group"]
    failed = _pvesh(node, f"create /nodes/{node.name}/qemu/100/status/start --output-format json")

    assert (failed.returncode, failed.stderr) == (
        0,
        "PCI device mapping invalid (hardware probably changed): "
        f"'iommugroup' does not match for 'gpu0' ({group} != 14) \n",
    )
    assert _status(node, lab_ssh) == "stopped"
    assert not (hosts.run_dir() / guest.name).exists()


def test_lab_down_stops_the_hypervisor_and_a_running_guest(
    pve_name: str, lab_ssh: Ssh, lab_leftovers: Leftovers
) -> None:
    def lab(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "lab", *args], check=True, capture_output=True, text=True, cwd=REPO
        ).stdout

    lab("up", pve_name, "--topology", "reference", "--pve")
    node = hosts.get_host(pve_name)
    hypervisor = int((node.state_dir / "companion.pid").read_text())
    _create_vm_with_8_gpus(node, lab_ssh)
    assert _pvesh(node, f"create /nodes/{node.name}/qemu/100/status/start").stderr == ""
    guest = hosts.get_host(f"{node.name}v100")
    retopo = lab("retopo", pve_name, "reference-renumbered")
    assert retopo.split("\t")[:5] == [
        pve_name,
        "up",
        "netns",
        f"root@{node.address}",
        "topology=reference-renumbered",
    ]
    assert lab_ssh(node, "cat /sys/bus/pci/devices/0000:21:00.0/device") == "0x2bb1\n"  # gpu0's new address

    assert lab("down", pve_name) == f"stopped: {pve_name}\n"

    assert lab_leftovers(node) == []
    assert lab_leftovers(guest) == []
    # Gone, or a zombie of PID 1 (it outlived the `python -m lab up` that started it): no command line left.
    assert not Path(f"/proc/{hypervisor}").exists() or Path(f"/proc/{hypervisor}/cmdline").read_bytes() == b""
