"""A Proxmox lab node's hypervisor boots a VM guest only from a disk that holds a system (lab/images.py):
a cloud image's guest takes its root keys, host key and address from the VM's cloud-init data
(lab/cloud_init.py) and runs the guest agent its user-data installs; an empty disk, or OVMF without an EFI
partition, boots nothing. Driven by hypervisor request files, as the pvesh stand-in sends them
(lab/pve/hypervisor.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import hosts, images
from lab.pve import node as pve_node

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
VOLUMES = "var/lib/pvegpu-lab/volumes/local-lvm"
MAC = "BC:24:11:5E:00:64"


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"c{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def _hv(node: hosts.LabHost, request: dict[str, Any]) -> dict[str, Any]:
    """Send one request to the node's hypervisor and wait for its answer."""
    folder = node.root / pve_node.HV_DIR
    stem = f"{request['vmid']}-{request['action']}-test{time.monotonic_ns()}"
    partial = folder / f"{stem}.partial-request"
    partial.write_text(json.dumps(request))
    partial.rename(folder / f"{stem}.request")
    answer_path = folder / f"{stem}.answer"
    deadline = time.monotonic() + 150
    while not answer_path.is_file():
        assert time.monotonic() < deadline, (node.state_dir / "companion.log").read_text()[-3000:]
        time.sleep(0.1)
    answer: dict[str, Any] = json.loads(answer_path.read_text())
    answer_path.unlink()
    return answer


def _disk(node: hosts.LabHost, vmid: int, meta: images.ImageMeta | None) -> dict[str, str]:
    path = node.root / VOLUMES / f"vm-{vmid}-disk-0"
    path.parent.mkdir(parents=True, exist_ok=True)
    if meta is None:
        path.write_bytes(b"")
    else:
        images.write_image(path, meta)
    return {"key": "scsi0", "volume": f"local-lvm:vm-{vmid}-disk-0", "path": f"/{VOLUMES}/vm-{vmid}-disk-0"}


def _free_index() -> int:
    """A lab address index no host uses (from the top, away from the lab's own first-free choice)."""
    used = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    return next(i for i in range(240, 150, -1) if f" 10.200.{i}.1/" not in used)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", path], check=True)
    return path.with_suffix(".pub").read_text()


def _ssh(address: str, key: Path, known_hosts: Path, command: str) -> subprocess.CompletedProcess[str]:
    options = ["IdentitiesOnly=yes", "BatchMode=yes", f"UserKnownHostsFile={known_hosts}"]
    options += ["StrictHostKeyChecking=yes", "LogLevel=ERROR", "ConnectTimeout=10"]
    argv = ["ssh", "-F", "/dev/null", *(a for o in options for a in ("-o", o)), "-i", str(key)]
    return subprocess.run(
        [*argv, f"root@{address}", command], check=False, capture_output=True, text=True, timeout=60
    )


def test_cloud_image_guest_gets_its_cloud_init_identity_and_agent(
    pve_name: str, tmp_path: Path, lab_ssh: Ssh
) -> None:
    node = pve_node.up(pve_name, "reference")
    operator_public = _keygen(tmp_path / "operator")
    host_public = _keygen(tmp_path / "guest_host")
    _keygen(tmp_path / "stranger")
    index = _free_index()
    address = f"10.200.{index}.2"
    planted = (
        f"{address} {' '.join(host_public.split()[:2])}\n"  # pvegpu records the key before first contact
    )
    hosts.known_hosts_path().write_text(hosts.known_hosts_path().read_text() + planted)

    # The node downloads its images from the hypervisor's server.
    name = "debian-12-genericcloud-amd64.qcow2"
    fetch = "import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1]).read())"
    downloaded = lab_ssh(node, f"python3 -c '{fetch}' {images.image_url(node, name)} | sha256sum")
    assert downloaded == f"{images.image_checksum(name, 'sha256')}  -\n"

    user_data = "#cloud-config\n" + yaml.safe_dump(
        {
            "hostname": "llm",
            "disable_root": False,
            "users": [{"name": "root", "ssh_authorized_keys": [operator_public.strip()]}],
            "ssh_keys": {
                "ed25519_private": (tmp_path / "guest_host").read_text(),
                "ed25519_public": host_public,
            },
            "ssh_deletekeys": True,
            "ssh_genkeytypes": [],
            "packages": ["qemu-guest-agent"],
        }
    )
    cloud_init = {
        "user_data": user_data,
        "ipconfig0": f"ip={address}/24,gw=10.200.{index}.1",
        "hostname": "llm",
        "mac": MAC,
    }
    start = {"action": "start", "vmid": 100, "machine": "q35", "bios": "ovmf", "devices": []}
    answer = _hv(node, {**start, "disk": _disk(node, 100, images.CATALOGUE[name]), "cloud_init": cloud_init})
    guest_name = f"{pve_name}v100"
    assert (answer["ok"], answer["guest"]) == (True, guest_name), answer
    guest = hosts.get_host(guest_name)
    assert (guest.address, guest.host_key_recorded) == (address, False)
    assert pve_node.guest_vm(guest) == {
        "node": pve_name,
        "vmid": 100,
        "os": "debian-12",
        "esp": True,
        "cloud_init": True,
        "agent": True,
    }

    # Strict first contact with the user-data key and the host key known in advance; the lab records nothing.
    operator_known = tmp_path / "known_hosts"
    operator_known.write_text(planted)
    done = _ssh(address, tmp_path / "operator", operator_known, "hostname; cat /root/.ssh/authorized_keys")
    assert (done.returncode, done.stdout) == (0, f"llm\n{operator_public}"), done.stderr
    assert _ssh(address, tmp_path / "stranger", operator_known, "true").returncode == 255
    lab_lines = hosts.known_hosts_path().read_text().splitlines(keepends=True)
    assert [line for line in lab_lines if line.startswith(f"{address} ")] == [planted]
    argv = hosts.ssh_argv(guest, "true")
    argv[argv.index("-i") + 1] = str(guest.key)
    lab_login = subprocess.run(argv, check=False, capture_output=True, timeout=60)
    assert lab_login.returncode == 255  # the lab's own key is not root's: only the user-data's keys are

    _check_agent(node, guest, address)

    # Stop: the guest and its agent are gone; the deployer's known_hosts line stays (a restart keeps the key).
    assert _hv(node, {"action": "stop", "vmid": 100}) == {"ok": True}
    assert not (node.root / pve_node.AGENT_DIR / "100.json").exists()
    assert guest_name not in [host.name for host in hosts.list_hosts()]
    assert planted in hosts.known_hosts_path().read_text()
    assert _hv(node, {"action": "agent", "vmid": 100, "command": "get-fsinfo", "params": {}}) == {
        "ok": False,
        "error": "QEMU guest agent is not running",
    }
    _check_nothing_boots(node, cloud_init)


def _check_agent(node: hosts.LabHost, guest: hosts.LabHost, address: str) -> None:
    """The guest agent: network info in the file the stand-in reads; other commands through the hypervisor."""
    agent_file = node.root / pve_node.AGENT_DIR / "100.json"
    assert json.loads(agent_file.read_text()) == {
        "result": [
            {
                "name": "lo",
                "hardware-address": "00:00:00:00:00:00",
                "ip-addresses": [
                    {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
                    {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128},
                ],
            },
            {
                "name": "enp6s18",
                "hardware-address": MAC.lower(),
                "ip-addresses": [
                    {"ip-address": address, "ip-address-type": "ipv4", "prefix": 24},
                    {"ip-address": "fe80::be24:11ff:fe5e:64", "ip-address-type": "ipv6", "prefix": 64},
                ],
            },
        ]
    }
    agent = {"action": "agent", "vmid": 100}
    fsinfo = _hv(node, {**agent, "command": "get-fsinfo", "params": {}})
    assert sorted(p.name for p in (guest.root / "boot/efi/EFI/debian").iterdir()) == [
        "grubx64.efi",
        "shimx64.efi",
    ]
    assert [(fs["mountpoint"], fs["type"]) for fs in fsinfo["result"]] == [
        ("/boot/efi", "vfat"),
        ("/", "ext4"),
    ]
    read = _hv(node, {**agent, "command": "file-read", "params": {"file": "/etc/hostname"}})
    assert read == {"ok": True, "result": {"content": "llm\n", "bytes-read": 4}}
    missing = _hv(node, {**agent, "command": "file-read", "params": {"file": "/nope"}})
    assert missing == {
        "ok": False,
        "error": "failed to open file '/nope' (mode: 'r'): No such file or directory",
    }
    write = {"file": "/etc/pvegpu-test", "content": "written\n"}
    assert _hv(node, {**agent, "command": "file-write", "params": write}) == {"ok": True, "result": None}
    assert (guest.root / "etc/pvegpu-test").read_text() == "written\n"
    started = _hv(node, {**agent, "command": "exec", "params": {"command": ["sh", "-c", "hostname; exit 3"]}})
    status: dict[str, Any] = {"exited": 0}
    deadline = time.monotonic() + 30
    while not status["exited"] and time.monotonic() < deadline:
        status = _hv(node, {**agent, "command": "exec-status", "params": started["result"]})["result"]
    assert status == {"exited": 1, "exitcode": 3, "out-data": "llm\n"}


def _check_nothing_boots(node: hosts.LabHost, cloud_init: dict[str, Any]) -> None:
    """Nothing to boot: an empty disk; OVMF and a disk without an EFI system partition."""
    hypervisor_pid = int((node.state_dir / "companion.pid").read_text())
    start = {"action": "start", "vmid": 100, "machine": "q35", "bios": "ovmf", "devices": []}
    name = "debian-12-genericcloud-amd64.qcow2"
    empty = _hv(node, {**start, "vmid": 101, "disk": _disk(node, 101, None), "cloud_init": cloud_init})
    assert empty == {"ok": True, "pid": hypervisor_pid, "guest": None}
    bios_only = images.ImageMeta("debian-12", esp=False, cloud_init=False, agent=True)
    no_esp = _hv(node, {**start, "vmid": 102, "disk": _disk(node, 102, bios_only), "cloud_init": None})
    assert no_esp == {"ok": True, "pid": hypervisor_pid, "guest": None}
    assert [host.name for host in hosts.list_hosts()] == [node.name]

    # A refused address fails the start, naming it.
    wrong = {**cloud_init, "ipconfig0": "ip=192.168.1.5/24,gw=192.168.1.1"}
    refused = _hv(
        node, {**start, "vmid": 103, "disk": _disk(node, 103, images.CATALOGUE[name]), "cloud_init": wrong}
    )
    assert refused == {
        "ok": False,
        "error": "ipconfig0: ip=192.168.1.5/24 is not a lab address (10.200.<1-250>.2/24)",
    }


def test_installed_system_boots_on_seabios_with_the_lab_identity(pve_name: str, lab_ssh: Ssh) -> None:
    """An installed i440FX/SeaBIOS VM (no cloud-init, no EFI partition): the guest gets the lab's own
    identity (recorded in the lab's known_hosts) and its agent runs."""
    node = pve_node.up(pve_name, "reference")
    installed = images.ImageMeta("debian-12", esp=False, cloud_init=False, agent=True)
    request = {"action": "start", "vmid": 100, "machine": "pc", "bios": "seabios", "devices": []}
    answer = _hv(node, {**request, "disk": _disk(node, 100, installed), "cloud_init": None, "mac": MAC})
    assert (answer["ok"], answer["guest"]) == (True, f"{pve_name}v100"), answer
    guest = hosts.get_host(f"{pve_name}v100")
    assert guest.host_key_recorded
    assert lab_ssh(guest, "hostname") == f"{guest.name}\n"
    nic = json.loads((node.root / pve_node.AGENT_DIR / "100.json").read_text())["result"][1]
    assert (nic["name"], nic["hardware-address"]) == ("ens18", MAC.lower())
    fsinfo = _hv(node, {"action": "agent", "vmid": 100, "command": "get-fsinfo", "params": {}})
    assert [fs["mountpoint"] for fs in fsinfo["result"]] == ["/"]
    assert not (guest.root / "boot/efi").exists()
    assert _hv(node, {"action": "stop", "vmid": 100}) == {"ok": True}
    assert guest.address not in hosts.known_hosts_path().read_text()


def test_vm_from_a_downloaded_image_through_pvesh(pve_name: str, tmp_path: Path, lab_ssh: Ssh) -> None:
    """The operator's path through the pvesh stand-in: download the image, create the VM from it with a
    cloud-init user snippet, start it; the guest answers with the pre-generated host key. A VM with an empty
    disk runs, and no guest appears."""
    node = pve_node.up(pve_name, "reference")
    operator_public, host_public = _keygen(tmp_path / "operator"), _keygen(tmp_path / "guest_host")
    image = "debian-12-genericcloud-amd64.qcow2"
    url, checksum = images.image_url(node, image), images.image_checksum(image, "sha512")
    lab_ssh(node, "pvesh set /storage/local --content backup,images,iso,rootdir,snippets,vztmpl,import")
    lab_ssh(
        node,
        f"pvesh create /nodes/{pve_name}/storage/local/download-url --content import --filename {image} "
        f"--url {url} --checksum {checksum} --checksum-algorithm sha512",
    )
    user_data = "#cloud-config\n" + yaml.safe_dump(
        {
            "hostname": "llm",
            "disable_root": False,
            "users": [{"name": "root", "ssh_authorized_keys": [operator_public.strip()]}],
            "ssh_keys": {
                "ed25519_private": (tmp_path / "guest_host").read_text(),
                "ed25519_public": host_public,
            },
            "packages": ["qemu-guest-agent"],
        }
    )
    snippet = node.root / "var/lib/vz/snippets/pvegpu-100-user.yaml"
    snippet.parent.mkdir(parents=True, exist_ok=True)
    snippet.write_text(user_data)
    index = _free_index()
    address = f"10.200.{index}.2"
    common = "--machine q35 --bios ovmf --agent 1 --efidisk0 local-lvm:1,efitype=4m,pre-enrolled-keys=0"
    from_image = (
        f"--net0 virtio={MAC},bridge=vmbr0 --scsi0 local-lvm:0,import-from=local:import/{image},iothread=1 "
        f"--ide2 local-lvm:cloudinit --ipconfig0 ip={address}/24,gw=10.200.{index}.1 "
        "--cicustom user=local:snippets/pvegpu-100-user.yaml"
    )
    lab_ssh(node, f"pvesh create /nodes/{pve_name}/qemu --vmid 100 --name llm {common} {from_image}")
    lab_ssh(node, f"pvesh create /nodes/{pve_name}/qemu/100/status/start")
    known = tmp_path / "known_hosts"
    known.write_text(f"{address} {' '.join(host_public.split()[:2])}\n")
    done = _ssh(address, tmp_path / "operator", known, "hostname")
    assert (done.returncode, done.stdout) == (0, "llm\n"), done.stderr
    interfaces = lab_ssh(
        node, f"pvesh get /nodes/{pve_name}/qemu/100/agent/network-get-interfaces --output-format json"
    )
    assert json.loads(interfaces)["result"][1]["ip-addresses"][0]["ip-address"] == address

    lab_ssh(node, f"pvesh create /nodes/{pve_name}/qemu --vmid 101 --name empty {common} --scsi0 local-lvm:4")
    lab_ssh(node, f"pvesh create /nodes/{pve_name}/qemu/101/status/start")
    status = lab_ssh(node, f"pvesh get /nodes/{pve_name}/qemu/101/status/current --output-format json")
    assert json.loads(status)["status"] == "running"
    assert [host.name for host in hosts.list_hosts()] == [pve_name, f"{pve_name}v100"]
