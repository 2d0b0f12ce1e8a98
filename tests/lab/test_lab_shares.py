"""A Proxmox lab node's guests see the node's directories as a real node gives them (lab/pve/shares.py):
a VM started through pvesh with `virtiofs0: <directory mapping>` mounts it in the guest with
`mount -t virtiofs <id> DIR` (the LAB STAND-IN mount.virtiofs), read-only with `-o ro`, writable without; a
tag without a device fails as mount(8) does; a CT with `mp0: <dir>,mp=/srv/x,ro=1` has the directory at
/srv/x, read-only. `lab down` of the node leaves
no mount behind. In both guest modes (lab.hosts: the binds made before the guest starts reach its mount
namespace under unshare + pivot_root and under systemd-nspawn alike)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator

import pytest

from lab import hosts, images
from lab.pve import node as pve_node

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
Leftovers = Callable[[hosts.LabHost], list[str]]
STORE = "/var/lib/pvegpu/models"
DISK = "var/lib/pvegpu-lab/volumes/local-lvm/vm-100-disk-0"
INSTALLED = images.ImageMeta("debian-12", esp=False, cloud_init=False)


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"s{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def run(host: hosts.LabHost, command: str) -> tuple[int, str, str]:
    done = subprocess.run(
        hosts.ssh_argv(host, command), check=False, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("guest_mode", hosts.MODES)
def test_vm_and_ct_see_the_nodes_directory_read_only_where_declared(
    pve_name: str, guest_mode: hosts.Mode, lab_ssh: Ssh, lab_leftovers: Leftovers
) -> None:
    node = pve_node.up(pve_name, "reference", guest_mode=guest_mode)
    lab_ssh(node, f"mkdir -p {STORE} && echo weights > {STORE}/config.json")
    lab_ssh(node, f"pvesh create /cluster/mapping/dir --id models --map node={pve_name},path={STORE}")
    # `memory` set: without it qemu-server's virtiofs RAM object is `size=M` (Memory.pm), which QEMU refuses.
    vm = "--vmid 100 --memory 2048 --scsi0 local-lvm:4 --virtiofs0 models"
    lab_ssh(node, f"pvesh create /nodes/{pve_name}/qemu {vm}")
    images.write_image(node.root / DISK, INSTALLED)
    lab_ssh(node, f"pvesh create /nodes/{pve_name}/qemu/100/status/start")
    guest = hosts.get_host(f"{pve_name}v100")

    read = run(guest, "mkdir -p /mnt/x && mount -t virtiofs models /mnt/x -o ro && cat /mnt/x/config.json")
    write = run(guest, "touch /mnt/x/new")
    assert read == (0, "weights\n", "")
    assert write == (1, "", "touch: cannot touch '/mnt/x/new': Read-only file system\n")
    lab_ssh(guest, "umount /mnt/x && mkdir /mnt/y && mount -t virtiofs models /mnt/y && echo rw > /mnt/y/rw")
    assert lab_ssh(node, f"cat {STORE}/rw") == "rw\n"
    unknown = run(guest, "mount -t virtiofs nosuchtag /mnt/x")
    assert unknown == (
        32,
        "",
        "mount: /mnt/x: wrong fs type, bad option, bad superblock on nosuchtag, missing codepage or helper "
        "program, or other error.\n"
        "       dmesg(1) may have more information after failed mount system call.\n",
    )

    lab_ssh(
        node,
        f"pvesh create /nodes/{pve_name}/lxc -vmid 200 -ostemplate local:vztmpl/d12.tar.zst "
        f"-mp0 {STORE},mp=/srv/x,ro=1 && pvesh create /nodes/{pve_name}/lxc/200/status/start",
    )
    ct = hosts.get_host(f"{pve_name}c200")

    assert run(ct, "cat /srv/x/config.json /srv/x/rw") == (0, "weights\nrw\n", "")
    assert run(ct, "touch /srv/x/new") == (
        1,
        "",
        "touch: cannot touch '/srv/x/new': Read-only file system\n",
    )

    hosts.down(pve_name)
    assert (lab_leftovers(guest), lab_leftovers(ct), lab_leftovers(node)) == ([], [], [])
