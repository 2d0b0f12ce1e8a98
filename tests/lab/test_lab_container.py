"""A Proxmox lab node (nspawn, real systemd) serving an LXC container from its own NVIDIA driver, through the
stand-ins only: the stand-in CUDA repository's host packages over apt "load" the module (GPUs on `nvidia`,
the version file), nvidia-modprobe makes the exact device nodes, the reboot stand-in keeps the module and
remakes the nodes through the boot unit; a CT with `devN` entries started through pvesh is a container lab
host with the node's hardware, nodes and module version; its userspace-only driver answers `pct exec`;
stopping it (and `lab down` of the node) leaves nothing behind."""

from __future__ import annotations

import os
import runpy
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from shlex import quote

import pytest

from lab import boot, guest_payload, hosts
from lab.pve import node as pve_node
from lab.pve.container import container_name

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
Leftovers = Callable[[hosts.LabHost], list[str]]
DRIVER = guest_payload.DRIVER_VERSIONS[0]
MODULE = (
    f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}  Release Build  "
    "(pvegpu lab STAND-IN)\nGCC version:  none (pvegpu lab STAND-IN)\n"
)
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
# What pvegpu's nvidia_driver role writes (templates/nvidia_driver/): the repository, the version pin, and
# in the container the record that forbids every kernel module package.
LIST = "/etc/apt/sources.list.d/lab.list"
APT_SETUP = (
    f"dpkg -i {guest_payload.APT_DIR}/{guest_payload.KEYRING_DEB} >/dev/null"
    f" && echo 'deb [signed-by={KEYRING}] {guest_payload.REPOSITORY_URL} /' > {LIST}"
    f" && apt-get update -qq -o Dir::Etc::sourcelist={LIST} -o Dir::Etc::sourceparts=-"
)
PIN = f"Package: nvidia-*\nPin: version {DRIVER}-*\nPin-Priority: 1001\n"
NO_MODULE = (
    "Package: nvidia-kernel-open-dkms nvidia-kernel-dkms nvidia-open dkms\n"
    "Pin: version *\nPin-Priority: -1\n\n"
)
INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq"
DEVICE_UNIT = """[Unit]
Description=NVIDIA device nodes for containers (test copy of pvegpu's unit)
Before=pve-guests.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/nvidia-modprobe -c 0 -c 1 -c 2 -c 3 -c 4 -c 5 -c 6 -c 7 -c 255 -m
ExecStart=/usr/bin/nvidia-modprobe -u -c 0

[Install]
WantedBy=multi-user.target
"""
UVM = 508  # the nvidia-modprobe stand-in's nvidia-uvm major: the lab machine's /proc/devices has none
NODES = [
    "/dev/nvidia-modeset character special file c3:fe 666",
    f"/dev/nvidia-uvm character special file {UVM:x}:0 666",
    f"/dev/nvidia-uvm-tools character special file {UVM:x}:1 666",
    *(f"/dev/nvidia{n} character special file c3:{n:x} 666" for n in range(8)),
    "/dev/nvidiactl character special file c3:ff 666",
]
DEVN = [*(f"/dev/nvidia{n}" for n in range(8)), "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
# In the container: the node's numbers, mode 0666, the entries' gid 44.
CT_NODES = [
    *(f"/dev/nvidia{n} c3:{n:x} 666 0:44" for n in range(8)),
    "/dev/nvidiactl c3:ff 666 0:44",
    f"/dev/nvidia-uvm {UVM:x}:0 666 0:44",
    f"/dev/nvidia-uvm-tools {UVM:x}:1 666 0:44",
]
STAT = "stat -c '%n %F %t:%T %a' /dev/nvidia*"


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"x{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def run(host: hosts.LabHost, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hosts.ssh_argv(host, command), check=False, capture_output=True, text=True, timeout=120
    )


def reboot_log(node: hosts.LabHost) -> list[str]:
    return (node.root / "var/log/pvegpu-lab/reboot.log").read_text().splitlines()


def host_driver(node: hosts.LabHost, lab_ssh: Ssh) -> None:
    """The host side of the lxc profile by hand, checked step by step: reboot without a driver, install it,
    the device unit, reboot with it."""
    displays = [a for a in node.gpu_drivers() if a.endswith(".0")]
    audio = {a: "snd_hda_intel" for a in node.gpu_drivers() if a.endswith(".1")}
    lab_ssh(node, "reboot")  # no driver installed: the GPUs boot without one
    assert node.gpu_drivers() == {**dict.fromkeys(displays), **audio}
    assert reboot_log(node)[-1] == (
        f"reboot: cmdline='{boot.GRUB_RUNNING}' vfio-pci=- nvidia=- pvegpu-nvidia-devices.service=not-enabled"
    )

    lab_ssh(node, f"{APT_SETUP} && printf %s {quote(PIN)} > /etc/apt/preferences.d/pvegpu-nvidia")
    packages = "nvidia-open nvidia-modprobe dkms proxmox-headers-$(uname -r) proxmox-default-headers"
    lab_ssh(node, f"{INSTALL} {packages}")

    assert node.gpu_drivers() == {**dict.fromkeys(displays, "nvidia"), **audio}
    version_file = node.root / guest_payload.VERSION_FILE.lstrip("/")
    assert version_file.read_text() == MODULE
    unit = "/etc/systemd/system/pvegpu-nvidia-devices.service"
    lab_ssh(node, f"printf %s {quote(DEVICE_UNIT)} > {unit} && systemctl enable --now -q {Path(unit).name}")
    assert lab_ssh(node, STAT).splitlines() == NODES

    lab_ssh(
        node, "mknod /dev/nvidia9 c 195 9 && rm /dev/nvidia0 && reboot"
    )  # a fresh /dev, remade by the unit

    assert lab_ssh(node, STAT).splitlines() == NODES
    assert version_file.read_text() == MODULE
    assert node.gpu_drivers() == {**dict.fromkeys(displays, "nvidia"), **audio}
    assert reboot_log(node)[-1].endswith(f" nvidia={DRIVER} pvegpu-nvidia-devices.service=started")


def container_userspace(ct: hosts.LabHost, lab_ssh: Ssh) -> None:
    """The container side of the lxc profile by hand: userspace only, no module package can come in."""
    lab_ssh(ct, f"{APT_SETUP} && printf %s {quote(NO_MODULE + PIN)} > /etc/apt/preferences.d/pvegpu-nvidia")
    lab_ssh(ct, f"{INSTALL} --no-install-recommends nvidia-driver-cuda")
    packages = lab_ssh(ct, "dpkg-query -W -f '${Package}\\n' 'nvidia*' dkms 2>/dev/null || true")
    assert packages == "nvidia-driver-cuda\n"


def test_host_driver_serves_a_container_through_pvesh_and_pct(
    pve_name: str, lab_ssh: Ssh, lab_leftovers: Leftovers
) -> None:
    node = pve_node.up(pve_name, "reference", mode="nspawn")
    boot.install(node, "grub")
    guest_payload.install(node)
    host_driver(node, lab_ssh)
    dev = " ".join(f"-dev{i} {path},gid=44" for i, path in enumerate(DEVN))
    lab_ssh(node, f"pvesh create /nodes/{pve_name}/lxc -vmid 200 -ostemplate local:vztmpl/d12.tar.zst {dev}")

    start = run(node, f"pvesh create /nodes/{pve_name}/lxc/200/status/start")

    assert (start.returncode, start.stderr) == (0, "")
    ct = hosts.get_host(container_name(pve_name, 200))
    assert ct.name == f"{pve_name}c200"
    assert (pve_node.role_of(ct), pve_node.container_ct(ct)) == ("container", {"node": pve_name, "vmid": 200})
    assert hosts.dependents(pve_name) == [ct.name]
    assert ct.gpu_drivers() == node.gpu_drivers()
    assert lab_ssh(ct, "stat -c '%n %t:%T %a %u:%g' " + " ".join(DEVN)).splitlines() == CT_NODES
    assert (ct.root / guest_payload.VERSION_FILE.lstrip("/")).read_text() == MODULE
    os.environ["PVEGPU_PROFILE"] = "lxc"  # inventory/lab.py lists the containers on the `lxc` profile
    try:
        inventory = runpy.run_path(str(Path(__file__).resolve().parents[2] / "inventory/lab.py"))
    finally:
        del os.environ["PVEGPU_PROFILE"]
    assert [(name, data["node"]["profile"]) for name, data in inventory["lxc_guests"]] == [(ct.name, "lxc")]
    assert [name for name, _ in inventory["pve_nodes"]] == [pve_name]

    container_userspace(ct, lab_ssh)
    smi = run(node, "pct exec 200 -- nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    status = run(node, "pct exec 200 -- sh -c 'echo out; echo err >&2; exit 3'")

    assert (smi.returncode, smi.stdout, smi.stderr) == (0, f"{DRIVER}\n" * 8, "")
    assert (status.returncode, status.stdout, status.stderr) == (3, "out\n", "err\n")

    stop = run(node, f"pvesh create /nodes/{pve_name}/lxc/200/status/stop")

    assert (stop.returncode, stop.stderr) == (0, "")
    assert lab_leftovers(ct) == []
    assert hosts.dependents(pve_name) == []
    stopped = run(node, "pct exec 200 -- true")
    not_running = "lxc-attach: 200: attach.c: lxc_attach: 1314 Failed to get init pid\n"
    assert (stopped.returncode, stopped.stdout, stopped.stderr) == (1, "", not_running)

    assert run(node, f"pvesh create /nodes/{pve_name}/lxc/200/status/start").stderr == ""
    again = hosts.get_host(ct.name)
    hosts.down(pve_name)

    assert lab_leftovers(node) == []
    assert lab_leftovers(again) == []
