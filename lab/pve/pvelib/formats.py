"""PVE::JSONSchema's registered formats and the standard options the endpoints use (pve-node, pve-vmid,
pve-configid, storage and volume ids, IP and tag lists), and the property-string formats (pci.cfg's `map`,
qemu-server's `hostpciN` and `numaN`, pve-container's `devN`, cloud-init's)."""

from __future__ import annotations

import ipaddress
import re

from . import access
from .jsonschema import P

PCI_ID = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}"


MAP_PCI = r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"


HOSTPCI_PCI = r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"


CONFIGID = re.compile(r"[a-z][a-z0-9_-]+", re.IGNORECASE)


NODE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?")


VMID = re.compile(r"[1-9][0-9]{2,8}")


USERID_OR_TOKEN = rf"{access.USER_RE}@{access.REALM_RE}(?:!{access.REALM_RE})?"  # $userid_or_token_regex


MACHINE = (
    r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?"
    r"|virt(?:-\d+(\.\d+)+)?(\+pve\d+)?)"
)


def verify_configid(value: str) -> None:
    if not CONFIGID.fullmatch(value):
        raise ValueError(f"invalid configuration ID '{value}'\n")


def verify_node(value: str) -> None:
    if not NODE.fullmatch(value):
        raise ValueError("value does not look like a valid node name\n")


def verify_vmid(value: str) -> None:
    if not VMID.fullmatch(value):
        raise ValueError("value does not look like a valid VM ID\n")


def verify_configid_list(value: str) -> None:
    for item in re.split(r"[,;\s]+", value.strip()):
        if item:
            verify_configid(item)


STORAGE_ID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE)


VOLUME_ID = re.compile(r"([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)", re.IGNORECASE | re.DOTALL)


DNS_NAME = re.compile(r"([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?")


CONTENT_TYPES = ("images", "rootdir", "vztmpl", "iso", "backup", "snippets", "none", "import")


def verify_storage_id(value: str) -> None:
    if not STORAGE_ID.fullmatch(value):
        raise ValueError(f"storage ID '{value}' contains illegal characters\n")


def verify_volume_id(value: str) -> None:
    if not VOLUME_ID.fullmatch(value):
        raise ValueError(f"unable to parse volume ID '{value}'\n")


def verify_content(value: str) -> None:
    if value not in CONTENT_TYPES:
        raise ValueError(f"invalid content type '{value}'\n")


def verify_content_list(value: str) -> None:
    for item in re.split(r"[,;\s]+", value.strip()):
        if item:
            verify_content(item)


def verify_cpuset(value: str) -> None:
    """QemuServer.pm pve_verify_cpuset (PVE::CpuSet::parse_cpuset): `0,5,8-11`; Perl's split drops trailing
    empty fields."""
    parts = value.split(",")
    while parts and not parts[-1]:
        parts.pop()
    for part in parts:
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ValueError("unable to parse cpuset option\n")


def verify_urlencoded(value: str) -> None:
    if not re.fullmatch(r"[-%a-zA-Z0-9_.!~*'()]*", value):
        raise ValueError(f"invalid urlencoded string: {value}\n")


def _is_ip(value: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(value).version == version
    except ValueError:
        return False


def _is_cidr(value: str, version: int) -> bool:
    address, sep, prefix = value.partition("/")
    limit = 32 if version == 4 else 128
    return bool(sep) and prefix.isdigit() and 7 < int(prefix) <= limit and _is_ip(address, version)


def verify_tag_list(value: str) -> None:
    r"""pve-tag-list (pve-common JSONSchema.pm): each tag `(?i)[a-z0-9_][a-z0-9_\-+.]*`."""
    for tag in re.split(r"[;,\s]+", value):
        if tag and not re.fullmatch(r"[a-z0-9_][a-z0-9_\-+.]*", tag, re.IGNORECASE):
            raise ValueError(f"invalid format - invalid tag '{tag}'")


def verify_ipv4(value: str) -> None:
    if not _is_ip(value, 4):
        raise ValueError("value does not look like a valid IPv4 address\n")


def verify_ipv6(value: str) -> None:
    if not _is_ip(value, 6):
        raise ValueError("value does not look like a valid IPv6 address\n")


def verify_ipv4_config(value: str) -> None:
    if value not in ("dhcp", "manual") and not _is_cidr(value, 4):
        raise ValueError("value does not look like a valid ipv4 network configuration\n")


def verify_ipv6_config(value: str) -> None:
    if value not in ("auto", "dhcp", "manual") and not _is_cidr(value, 6):
        raise ValueError("value does not look like a valid ipv6 network configuration\n")


def verify_address_list(value: str) -> None:
    for item in re.split(r"[,;\s]+", value.strip()):
        if item and not (_is_ip(item, 4) or _is_ip(item, 6) or DNS_NAME.fullmatch(item)):
            raise ValueError(f"value does not look like a valid address: {item}\n")


# The formats pvegpu's calls use (pve-guest-common Mapping/PCI.pm, qemu-server, pve-container).
MAP_FMT: dict[str, P] = {
    "node": P(optional=False, verify=verify_node),
    "path": P(optional=False, pattern=f"(?:{MAP_PCI};)*{MAP_PCI}"),
    "id": P(optional=False, pattern=PCI_ID),
    "subsystem-id": P(pattern=PCI_ID),
    "iommugroup": P(type="integer"),
    "description": P(max_length=4096),
}


def verify_dir_path(value: str) -> None:
    """pve-guest-common Mapping/Dir.pm pve_verify_path (format `pve-storage-path-in-property-string`): its
    regex has no end anchor, so only the first character after the leading `/` is checked."""
    if not re.match(r"/[^;,=\(\)]+", value):
        raise ValueError(
            "Value does not look like a valid absolute path."
            " These symbols are currently not allowed in path: ;,=()\n"
        )


# pve-guest-common Mapping/Dir.pm $map_fmt: a directory.cfg `map` entry.
DIR_MAP_FMT: dict[str, P] = {
    "node": P(optional=False, verify=verify_node),
    "path": P(optional=False, verify=verify_dir_path),
}


# qemu-server QemuServer/Virtiofs.pm $virtiofs_fmt (virtiofs0..virtiofs9): `dirid` the default key.
VIRTIOFS_FMT: dict[str, P] = {
    "dirid": P(optional=False, verify=verify_configid),
    "cache": P(enum=("auto", "always", "metadata", "never")),
    "direct-io": P(type="boolean"),
    "expose-xattr": P(type="boolean"),
    "expose-acl": P(type="boolean"),
}


HOSTPCI_FMT: dict[str, P] = {
    "host": P(pattern=f"{HOSTPCI_PCI}(;{HOSTPCI_PCI})*"),
    "mapping": P(verify=verify_configid),
    "pcie": P(type="boolean"),
    "rombar": P(type="boolean"),
    "x-vga": P(type="boolean"),
    "romfile": P(pattern=r"[^,;]+"),
    "mdev": P(pattern=r"[^/\.:]+"),
    "legacy-igd": P(type="boolean"),
    "vendor-id": P(pattern=r"0x[0-9a-fA-F]{4}"),
    "device-id": P(pattern=r"0x[0-9a-fA-F]{4}"),
    "sub-vendor-id": P(pattern=r"0x[0-9a-fA-F]{4}"),
    "sub-device-id": P(pattern=r"0x[0-9a-fA-F]{4}"),
    "driver": P(enum=("vfio", "keep")),
}


# qemu-server Memory.pm $numa_fmt (numa0..numa7): no default key, `cpus` required.
NUMA_SETS = r"\d+(?:-\d+)?(?:;\d+(?:-\d+)?)*"


NUMA_FMT: dict[str, P] = {
    "cpus": P(pattern=NUMA_SETS, optional=False),
    "memory": P(type="number"),
    "hostnodes": P(pattern=NUMA_SETS),
    "policy": P(enum=("preferred", "bind", "interleave")),
}


DEV_FMT: dict[str, P] = {
    "path": P(pattern=r"/dev/.+"),
    "gid": P(type="integer", minimum=0),
    "uid": P(type="integer", minimum=0),
    "mode": P(pattern=r"0[0-7]{3}"),
    "deny-write": P(type="boolean"),
}


def verify_disk_size(value: str) -> None:
    """pve-common JSONSchema.pm pve_verify_disk_size (parse_size): `<number>[K|M|G|T[iB]]`."""
    if not re.fullmatch(r"\d+(\.\d+)?([KMGT](?:iB)?)?", value):
        raise ValueError(f"value does not look like a valid disk size: {value}\n")


def verify_lxc_mp_string(value: str) -> None:
    """pve-container LXC/Config.pm verify_lxc_mp_string (format `pve-lxc-mp-string`): no `/./`, `/../`, no
    trailing `/.` or `/..`, no leading `../`."""
    if re.search(r"/\.\.?/", value) or re.search(r"/\.\.?$", value) or value.startswith("../"):
        raise ValueError(f"{value} contains illegal character sequences\n")


# pve-container LXC/Config.pm $mp_desc (mp0..mp255: $rootfs_desc plus backup, mp (required) and keepattrs):
# `volume` the default key, a storage volume, a host directory (bind mount) or a /dev/ device.
MOUNT_OPTIONS = r"(discard|lazytime|noatime|nodev|noexec|nosuid)"


MP_FMT: dict[str, P] = {
    "volume": P(optional=False, verify=verify_lxc_mp_string),
    "size": P(verify=verify_disk_size),
    "acl": P(type="boolean"),
    "mountoptions": P(pattern=rf"{MOUNT_OPTIONS}(;{MOUNT_OPTIONS})*"),
    "idmap": P(pattern=r"(?:passthrough|[ug]:[0-9]+:[0-9]+:[1-9][0-9]*(?:;[ug]:[0-9]+:[0-9]+:[1-9][0-9]*)*)"),
    "ro": P(type="boolean"),
    "quota": P(type="boolean"),
    "replicate": P(type="boolean"),
    "shared": P(type="boolean"),
    "backup": P(type="boolean"),
    "mp": P(optional=False, verify=verify_lxc_mp_string),
    "keepattrs": P(type="boolean"),
}


def mountpoint_type(volume: str) -> str:
    """LXC/Config.pm classify_mountpoint: `device` (/dev/...), `bind` (another absolute path) or `volume`."""
    if volume.startswith("/"):
        return "device" if volume.startswith("/dev/") else "bind"
    return "volume"


BOOL = P(type="boolean")


# qemu-server: $cicustom_fmt (QemuServer.pm), $ipconfig_fmt (QemuServer/Network.pm).
CICUSTOM_FMT: dict[str, P] = {
    key: P(verify=verify_volume_id) for key in ("meta", "network", "user", "vendor")
}


IPCONFIG_FMT: dict[str, P] = {
    "ip": P(verify=verify_ipv4_config),
    "gw": P(verify=verify_ipv4, requires="ip"),
    "ip6": P(verify=verify_ipv6_config),
    "gw6": P(verify=verify_ipv6, requires="ip6"),
}


NODE_P = P(optional=False, verify=verify_node)


VMID_P = P(type="integer", optional=False, verify=verify_vmid, minimum=100, maximum=999999999)
