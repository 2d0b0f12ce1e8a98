"""The guest config keys the stand-in models: qemu-server's confdesc and pve-container's, with their
indexed keys (`hostpciN`, `netN`, ...)."""

from __future__ import annotations

import re

from .formats import (
    BOOL,
    CICUSTOM_FMT,
    DEV_FMT,
    HOSTPCI_FMT,
    IPCONFIG_FMT,
    MACHINE,
    MP_FMT,
    NUMA_FMT,
    VIRTIOFS_FMT,
    verify_address_list,
    verify_cpuset,
    verify_tag_list,
    verify_urlencoded,
    verify_volume_id,
)
from .jsonschema import P

QEMU_KEYS: dict[str, P] = {
    "acpi": BOOL,
    "affinity": P(verify=verify_cpuset),
    "agent": P(),
    "args": P(),
    "balloon": P(type="integer", minimum=0),
    "bios": P(enum=("seabios", "ovmf")),
    "boot": P(),
    "cicustom": P(props=CICUSTOM_FMT),
    "cipassword": P(),
    "citype": P(enum=("configdrive2", "nocloud", "opennebula")),
    "ciupgrade": BOOL,
    "ciuser": P(),
    "cores": P(type="integer", minimum=1),
    "cpu": P(),
    "cpulimit": P(type="number"),
    "description": P(max_length=8192),
    "hookscript": P(verify=verify_volume_id),
    "hugepages": P(enum=("any", "2", "1024")),
    "keephugepages": BOOL,
    "kvm": BOOL,
    "lock": P(enum=("backup", "clone", "create", "migrate", "rollback", "snapshot", "suspended")),
    "machine": P(pattern=MACHINE + r"(,.*)?"),
    "memory": P(pattern=r"(current=)?\d+(,.*)?"),
    "meta": P(),
    "name": P(
        pattern=r"(([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]*[a-zA-Z0-9])\.)*"
        r"([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9\-]*[A-Za-z0-9])"
    ),
    "nameserver": P(verify=verify_address_list),
    "numa": BOOL,
    "onboot": BOOL,
    "ostype": P(
        enum=(
            "other",
            "wxp",
            "w2k",
            "w2k3",
            "w2k8",
            "wvista",
            "win7",
            "win8",
            "win10",
            "win11",
            "l24",
            "l26",
            "solaris",
        )
    ),
    "protection": BOOL,
    "scsihw": P(enum=("lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi")),
    "searchdomain": P(),
    "smbios1": P(),
    "sshkeys": P(verify=verify_urlencoded),
    "sockets": P(type="integer", minimum=1),
    "tablet": BOOL,
    "tags": P(verify=verify_tag_list),
    "template": BOOL,
    "vga": P(),
    "vmgenid": P(),
}


QEMU_INDEXED: dict[str, tuple[int, P]] = {
    "hostpci": (16, P(props=HOSTPCI_FMT, default_key="host")),
    "net": (32, P()),
    "scsi": (31, P()),
    "virtio": (16, P()),
    "sata": (6, P()),
    "ide": (4, P()),
    "efidisk": (1, P()),
    "ipconfig": (32, P(props=IPCONFIG_FMT)),
    "numa": (8, P(props=NUMA_FMT)),
    "serial": (4, P()),
    "usb": (5, P()),
    "virtiofs": (10, P(props=VIRTIOFS_FMT, default_key="dirid")),  # Virtiofs.pm $MAX_VIRTIOFS (PVE 8.4+)
}


QEMU_FAST_PLUG = ("name", "description", "onboot", "tags", "protection", "hookscript")


LXC_KEYS: dict[str, P] = {
    "arch": P(enum=("amd64", "i386", "arm64", "armhf", "riscv32", "riscv64")),
    "cmode": P(enum=("shell", "console", "tty")),
    "console": BOOL,
    "cores": P(type="integer", minimum=1, maximum=8192),
    "cpulimit": P(type="number"),
    "description": P(max_length=8192),
    "features": P(),
    "hostname": P(),
    "lock": P(),
    "memory": P(type="integer", minimum=16),
    "nameserver": P(),
    "onboot": BOOL,
    "ostype": P(),
    "protection": BOOL,
    "rootfs": P(),
    "searchdomain": P(),
    "startup": P(),
    "swap": P(type="integer", minimum=0),
    "tags": P(verify=verify_tag_list),
    "template": BOOL,
    "timezone": P(),
    "tty": P(type="integer", minimum=0, maximum=6),
    "unprivileged": BOOL,
}


LXC_INDEXED: dict[str, tuple[int, P]] = {
    "dev": (256, P(props=DEV_FMT, default_key="path")),
    "net": (32, P()),
    "mp": (256, P(props=MP_FMT, default_key="volume")),
}


def config_key_schema(key: str, keys: dict[str, P], indexed: dict[str, tuple[int, P]]) -> P | None:
    if key in keys:
        return keys[key]
    match = re.fullmatch(r"([a-z]+)(\d+)", key)
    if match and match.group(1) in indexed:
        count, schema = indexed[match.group(1)]
        if int(match.group(2)) < count and str(int(match.group(2))) == match.group(2):
            return schema
    return None


def qemu_extra(name: str) -> P | None:
    return config_key_schema(name, QEMU_KEYS, QEMU_INDEXED)


def lxc_extra(name: str) -> P | None:
    return config_key_schema(name, LXC_KEYS, LXC_INDEXED)


# QemuServer/Drive.pm valid_drive_names (this order).
DRIVE_NAMES = (
    *(f"ide{i}" for i in range(4)),
    *(f"scsi{i}" for i in range(31)),
    *(f"virtio{i}" for i in range(16)),
    *(f"sata{i}" for i in range(6)),
    "efidisk0",
    "tpmstate0",
)
