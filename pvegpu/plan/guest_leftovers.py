"""What an interrupted create leaves in a guest config: the marks that it never finished. Pure.

A Proxmox create (`POST /nodes/{node}/qemu`, `…/lxc`) allocates each disk it is asked for as
`<storage>:<GiB>` and stores the volume it made (`local-lvm:vm-100-disk-0,size=32G`), and gives every
network device a MAC (`virtio=BC:24:11:…` / `hwaddr=BC:24:11:…`); proxmox-api-behaviour.md §4.2, §6.1. A
stored disk that still reads `<storage>:<GiB>` or a network device without a MAC was never finished. So was
an empty config: what `qm unlock` leaves of a create killed before it wrote the final config (its stub held
only `lock: create`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_DISK = re.compile(r"(?:efidisk|tpmstate|ide|sata|scsi|virtio|mp)\d+|rootfs")
_UNALLOCATED = re.compile(r"[A-Za-z][\w.\-]*:\d+(?:\.\d+)?")
_NET = re.compile(r"net\d+")
_MAC = re.compile(r"(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}")


def left_by_a_create(values: Mapping[str, object]) -> bool:
    """Whether a guest config is what a create left: locked `create` (the stub a create writes first, kept
    while it runs and after it died), or with marks of an unfinished create (`unfinished`)."""
    return values.get("lock") == "create" or bool(unfinished(values))


def unfinished(values: Mapping[str, object]) -> tuple[str, ...]:
    """One phrase per mark of an unfinished create in a guest's config values, sorted by key:
    `scsi0 local-lvm:32 was never allocated`, `net0 virtio,bridge=vmbr0 has no MAC address`; for a config
    without any key, `its config is empty`."""
    if not values:
        return ("its config is empty",)
    marks = []
    for key in sorted(values):
        value = str(values[key])
        if _DISK.fullmatch(key) and _UNALLOCATED.fullmatch(value.split(",", 1)[0]):
            marks.append(f"{key} {value} was never allocated")
        elif _NET.fullmatch(key) and _MAC.search(value) is None:
            marks.append(f"{key} {value} has no MAC address")
    return tuple(marks)
