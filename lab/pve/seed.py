"""An "installed i440FX VM" on a Proxmox lab node: the reference user's own starting point, for converting
to Q35/OVMF (pvegpu/plan/convert.py).

`seed_vm(node, vmid, esp)` writes, in the node's root, what Proxmox holds for a Linux VM created in its GUI
with the defaults (i440FX: no `machine`; SeaBIOS: no `bios`), an OS installed on its disk and the node's
GPUs passed as conventional PCI (`hostpciN: mapping=gpuN`, no `pcie`):
- `/etc/pve/qemu-server/<vmid>.conf`, keys sorted as qemu-server writes them;
- its system disk `local-lvm:vm-<vmid>-disk-0` (the stand-in keeps an LVM-thin volume's data at
  /var/lib/pvegpu-lab/volumes/local-lvm/<name>): a lab image of an installed Debian 12 (lab/images.py: not a
  cloud image, qemu-guest-agent installed), with or without an EFI system partition.
The VM is stopped; it starts once its `gpuN` mappings exist (`pvesh create /nodes/<node>/qemu/<vmid>/status/
start`).

    python -m lab seed-vm NODE VMID --esp|--no-esp
"""

from __future__ import annotations

import hashlib
import uuid

from lab import hosts, images
from lab.errors import LabError
from lab.pve import node as pve_node

DISK_GIB = 32
VOLUMES = "var/lib/pvegpu-lab/volumes/local-lvm"  # the stand-in's LVM-thin data files, in the node root
MAPPING_PREFIX = "gpu"


class SeedError(LabError):
    """The VM cannot be seeded (the message says why)."""


def mac_of(node: str, vmid: int) -> str:
    """The VM's net0 MAC: Proxmox's `BC:24:11` prefix, the rest fixed by node and vmid."""
    digest = hashlib.sha1(f"seed:{node}:{vmid}".encode()).hexdigest().upper()
    return f"BC:24:11:{digest[0:2]}:{digest[2:4]}:{digest[4:6]}"


def seed_conf(node: str, vmid: int, gpus: int) -> str:
    """The conf file of the installed VM (module docstring) with `gpus` GPUs."""
    seeded = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.{vmid}.pvegpu-lab")
    values = {
        "agent": "1",
        "boot": "order=scsi0;net0",
        "cores": "4",
        "cpu": "host",
        "memory": "8192",
        "meta": "creation-qemu=8.1.5,ctime=1700000000",
        "name": "llm",
        "net0": f"virtio={mac_of(node, vmid)},bridge=vmbr0,firewall=1",
        "numa": "0",
        "ostype": "l26",
        "scsi0": f"local-lvm:vm-{vmid}-disk-0,iothread=1,size={DISK_GIB}G",
        "scsihw": "virtio-scsi-single",
        "smbios1": f"uuid={seeded}",
        "sockets": "1",
        "vmgenid": str(uuid.uuid5(seeded, "vmgenid")),
        **{f"hostpci{n}": f"mapping={MAPPING_PREFIX}{n}" for n in range(gpus)},
    }
    return "".join(f"{key}: {values[key]}\n" for key in sorted(values))


def seed_vm(name: str, vmid: int, esp: bool) -> str:
    """Write the installed VM `vmid` on Proxmox lab node `name` (module docstring); returns its conf path
    in the node. Raises SeedError when `name` is not a Proxmox lab node or the vmid is taken."""
    node = hosts.get_host(name)
    if pve_node.role_of(node) != "pve":
        raise SeedError(f"{name} is not a Proxmox lab node (python -m lab up {name} --pve)")
    conf = f"etc/pve/qemu-server/{vmid}.conf"
    if (node.root / conf).exists() or (node.root / f"etc/pve/lxc/{vmid}.conf").exists():
        raise SeedError(f"{name}: guest {vmid} already exists")
    gpus = len(node.manifest()["gpus"])
    disk = node.root / VOLUMES / f"vm-{vmid}-disk-0"
    disk.parent.mkdir(parents=True, exist_ok=True)
    meta = images.ImageMeta("debian-12", esp=esp, cloud_init=False, agent=True, virtual_size=DISK_GIB << 30)
    images.write_image(disk, meta)
    (node.root / conf).parent.mkdir(parents=True, exist_ok=True)
    (node.root / conf).write_text(seed_conf(name, vmid, gpus))
    return f"/{conf}"
