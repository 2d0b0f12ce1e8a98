#!/usr/bin/python3
"""pvesh: the pvegpu lab's STAND-IN for Proxmox VE's `pvesh`. This is NOT Proxmox.

Installed into lab Proxmox nodes as /usr/bin/pvesh (Debian's python3, stdlib only). It answers the API calls
pvegpu makes, the way `pvesh` does (shared/knowledge/proxmox-api-behaviour.md is the spec):

    pvesh <get|set|create|delete> <api_path> [--opt value]... [--output-format json|json-pretty]

- success: compact JSON with sorted keys + "\\n" on stdout (nothing for calls that return null); handler
  output (qemu PUT's `update VM ...`, task output) comes first;
- async calls (VM create, start, stop, shutdown) run to completion, then print their UPID; a failed task
  prints its error on stderr and still exits 0; `GET /nodes/{node}/tasks/{upid}/status` reads the log,
  which the worker writes as it runs: a worker killed mid-way (pvesh killed) leaves a log without a
  `TASK ...` line, its status is then `stopped` with exitstatus `unexpected status`, as in Proxmox;
  `GET /nodes/{node}/tasks` lists the tasks (newest first; `vmid`, `typefilter`, `source`, `limit`);
- a VM/CT create writes the stub config `lock: create` before its worker runs, and the worker replaces it
  with the final config; every write and start refuses a locked guest (`VM is locked (create)`) until the
  lock is removed (`qm unlock <vmid>` / `pct unlock <vmid>` on a real node; in the lab: `pvesh set
  .../config --delete lock --skiplock 1`);
- errors: `400 Parameter verification failed.` + one `<param>: <msg>` line each + the usage line; plain
  `die` texts; `Unknown option: <name>`; `No '<cmd>' handler defined for '<path>'` (exit 1); else exit 255.

State lives in Proxmox's file formats under the configured root: /etc/pve/mapping/pci.cfg,
/etc/pve/qemu-server/<vmid>.conf, /etc/pve/lxc/<ctid>.conf, /var/log/pve/tasks/. PCI hardware is read from
the configured sysfs root. A VM start checks every mapped path against that sysfs like Proxmox does, then asks
the lab hypervisor (lab/pve/hypervisor.py, outside the node) to bring the guest lab host up; a CT start checks
every `devN` device node, then asks it to bring the container lab host up. Stops ask it to stop them.

Settings: JSON file $PVEGPU_LAB_PVE_CONFIG (default /etc/pvegpu-lab/pve.json), keys: node (required),
sysfs_root ("/sys"), root ("/": prefix of every state path), hypervisor_dir (null: VMs only change state),
hypervisor_timeout_s (180), version ("9.0.3"), release ("9.0"), storages (["local", "local-lvm"]).

Not modelled: other endpoints and options (e.g. VM create's `start`, `pool`; unpacking a CT's template: the
container lab host is a Debian root, whatever `ostemplate` says), permissions
(pvesh runs as root@pam), proxying to other nodes, HA, hotplug (a running VM keeps every change but
name/description/onboot/tags/protection pending), PCI vendor/device names, output formats other than
json/json-pretty (the default prints json-pretty), a real QEMU process (a running VM is
/run/qemu-server/<vmid>.pid holding the guest lab host's PID).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

CONFIG_ENV = "PVEGPU_LAB_PVE_CONFIG"
DEFAULT_CONFIG = "/etc/pvegpu-lab/pve.json"
USER = "root@pam"
HELP = """\
pvesh - the pvegpu lab's STAND-IN for Proxmox VE's pvesh (not Proxmox; see /usr/bin/pvesh's docstring)

USAGE: pvesh <get|set|create|delete> <api_path> [OPTIONS] [--output-format json|json-pretty]

Endpoints: /version, /cluster/mapping/pci[/{id}], /nodes/{node}/qemu,
/nodes/{node}/qemu/{vmid}/config, /nodes/{node}/qemu/{vmid}/status/{current|start|stop|shutdown},
/nodes/{node}/lxc[/{vmid}/config|/{vmid}/status/{current|start|stop}],
/nodes/{node}/tasks, /nodes/{node}/tasks/{upid}/status
"""
CMDS = {"get": "GET", "set": "PUT", "create": "POST", "delete": "DELETE"}
Json = Any


# --- errors ------------------------------------------------------------------------------------


class DieError(Exception):
    """A plain Perl `die "text\\n"`: printed as is, HTTP 500 over the API."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class ParamError(Exception):
    """A 400 parameter exception: one message per parameter."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(errors)
        self.errors = errors


class OptionError(Exception):
    """Getopt refused an option (unknown, repeated, missing value): `Unknown option: <name>` etc."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines)
        self.lines = lines


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    node: str
    sysfs_root: Path
    root: Path
    hypervisor_dir: Path | None
    hypervisor_timeout_s: float
    version: str
    release: str
    storages: tuple[str, ...]

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")


# The usage counters of a guest's status/current: the stand-in runs nothing, so they stay 0.
_IDLE_COUNTERS: dict[str, object] = {
    "mem": 0,
    "maxdisk": 0,
    "disk": 0,
    "uptime": 0,
    "cpu": 0,
    "netin": 0,
    "netout": 0,
    "diskread": 0,
    "diskwrite": 0,
    "ha": {"managed": 0},
}


def load_settings() -> Settings:
    data = json.loads(Path(os.environ.get(CONFIG_ENV, DEFAULT_CONFIG)).read_text())
    hv = data.get("hypervisor_dir")
    return Settings(
        node=data["node"],
        sysfs_root=Path(data.get("sysfs_root", "/sys")),
        root=Path(data.get("root", "/")),
        hypervisor_dir=Path(hv) if hv else None,
        hypervisor_timeout_s=float(data.get("hypervisor_timeout_s", 180)),
        version=data.get("version", "9.0.3"),
        release=data.get("release", "9.0"),
        storages=tuple(data.get("storages", ("local", "local-lvm"))),
    )


# --- parameter schema (PVE::JSONSchema) -----------------------------------------------------------

PCI_ID = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}"
MAP_PCI = r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
HOSTPCI_PCI = r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
CONFIGID = re.compile(r"[a-z][a-z0-9_-]+", re.IGNORECASE)
NODE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?")
VMID = re.compile(r"[1-9][0-9]{2,8}")
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


@dataclass(frozen=True)
class P:
    """One parameter: JSON type, constraints, and for property strings the sub-schema."""

    type: str = "string"
    optional: bool = True
    pattern: str | None = None
    verify: Callable[[str], None] | None = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    enum: tuple[str, ...] = ()
    props: dict[str, P] | None = None  # a property string (format => {...})
    default_key: str | None = None
    list_format: bool = False  # a `*-list` format: repeats are joined with ","
    items: P | None = None  # array items


def _add(errors: dict[str, str], path: str, msg: str) -> None:
    errors.setdefault(path, msg)


def check_value(path: str, schema: P, value: Any, errors: dict[str, str]) -> Any:  # noqa: PLR0911, PLR0912
    """JSONSchema::check_prop for a CLI value (a string, or a list for arrays); returns the typed value."""
    if schema.type == "array":
        assert schema.items is not None
        return [check_value(f"{path}[{i}]", schema.items, v, errors) for i, v in enumerate(value)]
    if schema.type == "boolean":
        parsed = parse_boolean(value)
        if parsed is None:
            _add(errors, path, f"type check ('boolean') failed - got '{value}'")
        return parsed
    if schema.type == "integer":
        if not re.fullmatch(r"[+-]?\d+", value):
            _add(errors, path, f"type check ('integer') failed - got '{value}'")
            return None
        number = int(value)
        if schema.verify is not None and not _verified(path, schema, value, errors):
            return None
        if schema.minimum is not None and number < schema.minimum:
            _add(errors, path, f"value must have a minimum value of {schema.minimum}")
        if schema.maximum is not None and number > schema.maximum:
            _add(errors, path, f"value must have a maximum value of {schema.maximum}")
        return number
    if schema.type == "number":
        if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", value):
            _add(errors, path, f"type check ('number') failed - got '{value}'")
        return value
    if schema.props is not None:
        try:
            parsed_ps = parse_property_string(schema, value)
        except ValueError as error:
            _add(errors, path, f"invalid format - {str(error).rstrip()}")
            return value
        check_object(path, schema.props, parsed_ps, errors)
        return value
    if schema.verify is not None and not _verified(path, schema, value, errors):
        return value
    if schema.pattern is not None and not re.fullmatch(schema.pattern, value):
        _add(errors, path, "value does not match the regex pattern")
    if schema.max_length is not None and len(value) > schema.max_length:
        _add(errors, path, f"value may only be {schema.max_length} characters long")
    if schema.enum and value not in schema.enum:
        _add(
            errors,
            path,
            f"value '{value}' does not have a value in the enumeration '{', '.join(schema.enum)}'",
        )
    return value


def _verified(path: str, schema: P, value: str, errors: dict[str, str]) -> bool:
    assert schema.verify is not None
    try:
        schema.verify(value)
    except ValueError as error:
        _add(errors, path, f"invalid format - {str(error).rstrip()}")
        return False
    return True


def check_object(path: str, props: dict[str, P], value: dict[str, str], errors: dict[str, str]) -> None:
    for key, schema in props.items():
        if key not in value:
            if not schema.optional:
                _add(errors, f"{path}.{key}", "property is missing and it is not optional")
            continue
        check_value(f"{path}.{key}", schema, value[key], errors)


def parse_property_string(schema: P, text: str) -> dict[str, str]:
    """JSONSchema::parse_property_string's syntax errors (ValueError); values are checked by the caller."""
    assert schema.props is not None
    result: dict[str, str] = {}
    for part in text.split(","):
        if part == "":
            continue
        match = re.fullmatch(r"([^=]+)=(.+)", part, re.DOTALL)
        if match:
            key, value = match.groups()
            if key in result:
                raise ValueError(f"duplicate key in comma-separated list property: {key}\n")
            if key not in schema.props:
                raise ValueError(f"invalid key in comma-separated list property: {key}\n")
            result[key] = value
        elif "=" not in part:
            if schema.default_key is None:
                raise ValueError("value without key, but schema does not define a default key\n")
            if schema.default_key in result:
                raise ValueError(f"duplicate key in comma-separated list property: {schema.default_key}\n")
            result[schema.default_key] = part
        else:
            raise ValueError("missing key in comma-separated list property\n")
    return result


def parse_boolean(value: str) -> int | None:
    lowered = value.lower()
    if lowered in ("1", "on", "yes", "true"):
        return 1
    if lowered in ("0", "off", "no", "false"):
        return 0
    return None


# The formats pvegpu's calls use (pve-guest-common Mapping/PCI.pm, qemu-server, pve-container).
MAP_FMT: dict[str, P] = {
    "node": P(optional=False, verify=verify_node),
    "path": P(optional=False, pattern=f"(?:{MAP_PCI};)*{MAP_PCI}"),
    "id": P(optional=False, pattern=PCI_ID),
    "subsystem-id": P(pattern=PCI_ID),
    "iommugroup": P(type="integer"),
    "description": P(max_length=4096),
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
DEV_FMT: dict[str, P] = {
    "path": P(pattern=r"/dev/.+"),
    "gid": P(type="integer", minimum=0),
    "uid": P(type="integer", minimum=0),
    "mode": P(pattern=r"0[0-7]{3}"),
    "deny-write": P(type="boolean"),
}
BOOL = P(type="boolean")

QEMU_KEYS: dict[str, P] = {
    "acpi": BOOL,
    "agent": P(),
    "args": P(),
    "balloon": P(type="integer", minimum=0),
    "bios": P(enum=("seabios", "ovmf")),
    "boot": P(),
    "cores": P(type="integer", minimum=1),
    "cpu": P(),
    "cpulimit": P(type="number"),
    "description": P(max_length=8192),
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
    "smbios1": P(),
    "sockets": P(type="integer", minimum=1),
    "tablet": BOOL,
    "tags": P(),
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
    "numa": (8, P()),
    "serial": (4, P()),
    "usb": (5, P()),
}
QEMU_FAST_PLUG = ("name", "description", "onboot", "tags", "protection")
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
    "tags": P(),
    "template": BOOL,
    "timezone": P(),
    "tty": P(type="integer", minimum=0, maximum=6),
    "unprivileged": BOOL,
}
LXC_INDEXED: dict[str, tuple[int, P]] = {
    "dev": (256, P(props=DEV_FMT, default_key="path")),
    "net": (32, P()),
    "mp": (256, P()),
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


# --- option parsing (Getopt::Long through JSONSchema::get_options) ---------------------------------


@dataclass(frozen=True)
class Endpoint:
    method: str
    params: dict[str, P]
    handler: Callable[[Call], Json]
    returns_null: bool = False
    extra: Callable[[str], P | None] | None = None  # config keys accepted on top of `params`


@dataclass
class Call:
    settings: Settings
    path_params: dict[str, str]
    params: dict[str, Any]
    out: list[str] = field(default_factory=list)


FORMAT_OPTIONS = {"output-format", "noproxy", "human-readable", "noborder", "noheader", "quiet"}


def parse_options(argv: list[str], endpoint: Endpoint) -> tuple[dict[str, Any], str]:
    """Options -> raw values (strings; lists for arrays); returns (params, output format)."""
    raw: dict[str, Any] = {}
    output = "json-pretty"
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        match = re.fullmatch(r"--?([^=]+?)(?:=(.*))?", arg, re.DOTALL)
        if not match or arg in ("-", "--"):
            raise OptionError([])
        name, inline = match.group(1), match.group(2)
        schema = schema_of(endpoint, name)
        if name in FORMAT_OPTIONS:
            value, i = _take(argv, i, inline, boolean=name != "output-format")
            if name == "output-format":
                output = value
            continue
        if schema is None:
            unknown.append(name)
            _, i = _take(argv, i, inline, boolean=True)
            continue
        value, i = _take(argv, i, inline, boolean=schema.type == "boolean")
        if schema.type == "boolean" and parse_boolean(value) is None:
            raise OptionError([])  # get_options runs parse_boolean itself
        if schema.type == "array":
            raw.setdefault(name, []).append(value)
        elif name in raw:
            if not schema.list_format:
                raise OptionError([f"Duplicate option: {name}"])
            raw[name] = f"{raw[name]},{value}"
        else:
            raw[name] = value
    if unknown:
        raise OptionError([f"Unknown option: {name}" for name in unknown])
    return raw, output


def _take(argv: list[str], i: int, inline: str | None, *, boolean: bool) -> tuple[str, int]:
    if inline is not None:
        return inline, i + 1
    nxt = argv[i + 1] if i + 1 < len(argv) else None
    if nxt is None or (boolean and re.match(r"--?[A-Za-z]", nxt)):
        if boolean:
            return "1", i + 1
        raise OptionError([f"Option {argv[i].lstrip('-')} requires an argument"])
    return nxt, i + 2


def schema_of(endpoint: Endpoint, name: str) -> P | None:
    if name in endpoint.params:
        return endpoint.params[name]
    return endpoint.extra(name) if endpoint.extra else None


def usage(cmd: str, endpoint: Endpoint) -> str:
    required = [f"--{k} {_type_text(p)}" for k, p in sorted(endpoint.params.items()) if not p.optional]
    has_optional = any(p.optional for p in endpoint.params.values()) or endpoint.extra is not None
    words = ["pvesh", cmd, "<api_path>", *required]
    if has_optional:
        words.append("[OPTIONS]")
    words.append("[FORMAT_OPTIONS]")
    return " ".join(words)


def _type_text(p: P) -> str:
    if p.enum:
        return f"<{' | '.join(p.enum)}>"
    if p.type == "integer" and p.minimum is not None and p.maximum is not None:
        return f"<integer> ({p.minimum} - {p.maximum})"
    return f"<{p.type}>"


# --- files -------------------------------------------------------------------------------------


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    partial.write_text(text)
    partial.rename(path)


@contextmanager
def locked(settings: Settings) -> Iterator[None]:
    """One lock for every write (cfs locks and per-VM flocks in Proxmox): pyinfra runs hosts in parallel."""
    lock = settings.path("/run/lock/pvegpu-lab-pvesh.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# --- /etc/pve/mapping/pci.cfg (PVE::SectionConfig with Mapping/PCI.pm's header) -------------------


@dataclass
class Section:
    id: str
    map: list[str]
    options: dict[str, Any]  # description (str), mdev / live-migration-capable (0/1)


MAPPING_CFG = "/etc/pve/mapping/pci.cfg"
MAPPING_OPTIONS = ("description", "live-migration-capable", "mdev")


def parse_mapping_cfg(text: str) -> list[Section]:
    """Sections in file order; invalid ids, bad values and sections without a valid map are dropped."""
    sections: list[Section] = []
    current: Section | None = None
    skip = False
    for line in text.split("\n"):
        if re.match(r"\s*#", line):
            continue
        if line == "":
            current, skip = None, False
            continue
        header = re.fullmatch(r"(\S+)\s*", line)
        if current is None and not skip and header:
            if CONFIGID.fullmatch(header.group(1)):
                current = Section(header.group(1), [], {})
                sections.append(current)
            else:
                skip = True
            continue
        prop = re.fullmatch(r"\s+(\S+)(\s+(.*\S))?\s*", line)
        if current is None or prop is None:
            continue
        key, value = prop.group(1), prop.group(3)
        if key == "map" and value is not None:
            errors: dict[str, str] = {}
            check_value("map", P(props=MAP_FMT), value, errors)
            if not errors:
                current.map.append(value)
        elif key in ("mdev", "live-migration-capable"):
            if value is None or value in ("0", "1"):
                current.options[key] = 1 if value is None else int(value)
        elif key == "description" and value is not None:
            current.options[key] = value
    return [s for s in sections if s.map]


def write_mapping_cfg(sections: list[Section]) -> str:
    out = []
    for s in sections:
        out.append(f"{s.id}\n")
        out.extend(f"\tmap {m}\n" for m in s.map)
        out.extend(f"\t{k} {s.options[k]}\n" for k in MAPPING_OPTIONS if k in s.options)
        out.append("\n")
    return "".join(out)


# --- sysfs (PVE::SysFSTools) ---------------------------------------------------------------------


def _attr(device: Path, name: str) -> str | None:
    try:
        return (device / name).read_text().strip()
    except OSError:
        return None


def pci_device_info(settings: Settings, address: str) -> dict[str, Any] | None:
    device = settings.sysfs_root / "bus/pci/devices" / address
    irq, vendor, dev = _attr(device, "irq"), _attr(device, "vendor"), _attr(device, "device")
    if irq is None or not irq.isdigit() or not vendor or not dev:
        return None
    if not vendor.startswith("0x") or not dev.startswith("0x"):
        return None
    info: dict[str, Any] = {"vendor": vendor, "device": dev}
    sub_vendor, sub_device = _attr(device, "subsystem_vendor"), _attr(device, "subsystem_device")
    if sub_vendor is not None and sub_device is not None:
        info["subsystem_vendor"], info["subsystem_device"] = sub_vendor, sub_device
    try:
        group = re.search(r"(\d+)$", os.readlink(device / "iommu_group"))
        info["iommugroup"] = int(group.group(1)) if group else None
    except OSError:
        info["iommugroup"] = None
    info["mdev"] = (device / "mdev_supported_types").is_dir() or (device / "nvidia").is_dir()
    return info


def assert_valid(settings: Settings, name: str, entry: dict[str, str], section: Section | None) -> None:
    """PVE::Mapping::PCI::assert_valid: raises DieError with Proxmox's text (ending in "\\n")."""
    for idx, path in enumerate(entry["path"].split(";")):
        address = path if "." in path else f"{path}.0"
        info = pci_device_info(settings, address)
        if info is None:
            raise DieError(f"pci device '{address}' not found\n")
        expected: dict[str, str] = {"id": f"{info['vendor']}:{info['device']}"}
        if info["iommugroup"] is not None:
            expected["iommugroup"] = str(info["iommugroup"])
        if "subsystem_vendor" in info:
            expected["subsystem-id"] = f"{info['subsystem_vendor']}:{info['subsystem_device']}"
        configured: dict[str, str] = {k: entry[k] for k in ("id", "iommugroup", "subsystem-id") if k in entry}
        if section is not None:
            expected["mdev"] = "1" if info["mdev"] else "0"
            configured["mdev"] = "1" if section.options.get("mdev") else "0"
        for key in sorted(set(expected) | set(configured)):
            if key == "iommugroup" and idx > 0:
                continue
            hw, cfg = expected.get(key), configured.get(key)
            if hw is None and cfg is None:
                continue
            if cfg is None:
                raise DieError(f"missing expected property '{key}' for device '{address}'\n")
            if hw is None:
                raise DieError(f"unexpected property '{key}' configured for device '{address}'\n")
            hw, cfg = hw.replace("0x", ""), cfg.replace("0x", "")
            if hw != cfg:
                raise DieError(f"'{key}' does not match for '{name}' ({hw} != {cfg})\n")


def slot_functions(settings: Settings, pci_id: str) -> list[str]:
    """SysFSTools::lspci($id): the functions whose address starts with `pci_id` (domain optional)."""
    full = pci_id if re.match(r"[a-f0-9]{4,}:[a-f0-9]{2}:", pci_id) else f"0000:{pci_id}"
    devices = settings.sysfs_root / "bus/pci/devices"
    names = sorted(p.name for p in devices.iterdir()) if devices.is_dir() else []
    if "." in full:
        return [n for n in names if n == full]
    return [n for n in names if n.startswith(full + ".")]


# --- tasks ---------------------------------------------------------------------------------------

UPID_RE = re.compile(
    r"UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):"
    r"([^:\s/]+):([^:\s/]*):([^:\s/]+):"
)


def _pstart(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def task_log_path(settings: Settings, upid: str, starttime: str) -> Path:
    return settings.path(f"/var/log/pve/tasks/{starttime[-1].upper()}/{upid}")


def run_task(
    call: Call, task_type: str, task_id: str, worker: Callable[[Callable[[str], None]], None]
) -> str:
    """fork_worker under pvesh (sync): worker output to stdout and the log; returns the UPID."""
    settings = call.settings
    pid = os.getpid()
    starttime = f"{int(time.time()):08X}"
    upid = f"UPID:{settings.node}:{pid:08X}:{_pstart(pid):08X}:{starttime}:{task_type}:{task_id}:{USER}:"
    log_path = task_log_path(settings, upid, starttime)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")  # the log exists while the task runs: a killed worker leaves it unfinished

    def emit(line: str) -> None:
        with log_path.open("a") as log:
            log.write(line + "\n")
        sys.stdout.write(line + "\n")

    status = "OK"
    try:
        worker(emit)
        ending = "TASK OK\n"
    except DieError as error:
        # fork_worker: chomp one "\n", then every remaining "\n" becomes a space.
        message = error.text[:-1] if error.text.endswith("\n") else error.text
        status = message.replace("\n", " ")
        sys.stderr.write(status + "\n")
        ending = f"\nTASK ERROR: {status}\n"
    with log_path.open("a") as log:
        log.write(ending)
    with settings.path("/var/log/pve/tasks/index").open("a") as index:
        index.write(f"{upid} {int(time.time()):08X} {status}\n")
    return upid


def get_task_status(call: Call) -> Json:
    upid = call.path_params["upid"]
    match = UPID_RE.fullmatch(upid)
    if not match:
        raise ParamError({"upid": "unable to parse worker upid"})
    node, _, pid_hex, pstart_hex, start_hex, task_type, task_id, user = match.groups()
    log_path = task_log_path(call.settings, upid, start_hex)
    if not log_path.is_file():
        raise ParamError({"upid": "no such task"})
    pid, pstart = int(pid_hex, 16), int(pstart_hex, 16)
    try:
        running = _pstart(pid) == pstart and pid != os.getpid()
    except (OSError, IndexError, ValueError):
        running = False
    result: dict[str, Any] = {
        "upid": upid,
        "node": node,
        "pid": pid,
        "pstart": pstart,
        "starttime": int(start_hex, 16),
        "type": task_type,
        "id": task_id,
        "user": user,
        "status": "running" if running else "stopped",
    }
    if not running:
        lines = log_path.read_text().splitlines()
        last = lines[-1] if lines else ""
        if last == "TASK OK":
            result["exitstatus"] = "OK"
        elif last.startswith("TASK ERROR: "):
            result["exitstatus"] = last[len("TASK ERROR: ") :]
        elif last.startswith("TASK WARNINGS: "):
            result["exitstatus"] = last[len("TASK ") :]
        else:
            result["exitstatus"] = "unexpected status"
    return result


def list_tasks(call: Call) -> Json:
    """`GET /nodes/{node}/tasks`: every task with a log, newest first; an ended one (its log has a `TASK`
    line, or its process is gone) with `status` (its exit status, as the status endpoint gives it) and
    `endtime` (the log's mtime). Filters: `vmid`, `typefilter`, `limit` (default 50); `source` is accepted,
    every task being listed (this stand-in keeps no separate active list)."""
    tasks = []
    for log_path in call.settings.path("/var/log/pve/tasks").glob("*/UPID:*"):
        upid = log_path.name
        match = UPID_RE.fullmatch(upid)
        if match is None:
            continue
        task = get_task_status(Call(call.settings, {"upid": upid}, {}))
        if "vmid" in call.params and task["id"] != str(call.params["vmid"]):
            continue
        if call.params.get("typefilter") not in (None, task["type"]):
            continue
        entry = {
            key: task[key] for key in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user")
        }
        if task["status"] == "stopped":
            entry.update(status=task["exitstatus"], endtime=int(log_path.stat().st_mtime))
        tasks.append(entry)
    tasks.sort(key=lambda task: (task["starttime"], task["upid"]), reverse=True)
    return tasks[: int(call.params.get("limit", 50))]


# --- endpoints: version --------------------------------------------------------------------------------


def get_version(call: Call) -> Json:
    s = call.settings
    return {"release": s.release, "repoid": sha1(s.version.encode())[:8], "version": s.version}


# --- endpoints: cluster PCI mappings -------------------------------------------------------------------


def _mapping_state(settings: Settings) -> tuple[list[Section], str]:
    data = read_bytes(settings.path(MAPPING_CFG))
    return parse_mapping_cfg(data.decode()), sha1(data)


def _section_json(section: Section) -> dict[str, Any]:
    return {"map": list(section.map), "type": "pci", **section.options}


def _map_entry(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if part)


def list_mappings(call: Call) -> Json:
    sections, digest = _mapping_state(call.settings)
    check_node = call.params.get("check-node")
    if check_node is not None:
        _local_node(call.settings, check_node)
    result = []
    for section in sections:
        entry = {"id": section.id, "digest": digest, **_section_json(section)}
        if check_node is not None:
            checks = []
            lines = [_map_entry(m) for m in section.map]
            mine = [m for m in lines if m.get("node") == check_node]
            if not mine:
                checks.append({"severity": "warning", "message": f"No mapping for node {check_node}."})
            for line in mine:
                try:
                    assert_valid(call.settings, section.id, line, section)
                except DieError as error:
                    checks.append({"severity": "error", "message": f"Invalid configuration: {error.text}"})
            entry["checks"] = checks
        result.append(entry)
    return result


def get_mapping(call: Call) -> Json:
    sections, digest = _mapping_state(call.settings)
    for section in sections:
        if section.id == call.path_params["id"]:
            return {**_section_json(section), "digest": digest}
    raise DieError(f"mapping '{call.path_params['id']}' not found\n")


def _mapping_options(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in MAPPING_OPTIONS if k in params}


def create_mapping(call: Call) -> Json:
    with locked(call.settings):
        sections, _ = _mapping_state(call.settings)
        mapping_id = call.params["id"]
        if any(s.id == mapping_id for s in sections):
            raise DieError(f"create hardware mapping failed: pci ID '{mapping_id}' already defined\n")
        sections.append(Section(mapping_id, list(call.params["map"]), _mapping_options(call.params)))
        write_atomic(call.settings.path(MAPPING_CFG), write_mapping_cfg(sections))
    return None


def update_mapping(call: Call) -> Json:
    prefix = "update hardware mapping failed: "
    mapping_id = call.path_params["id"]
    with locked(call.settings):
        sections, digest = _mapping_state(call.settings)
        if "digest" in call.params and call.params["digest"] != digest:
            raise DieError(
                f"{prefix}detected modified configuration - file changed by other user? Try again.\n"
            )
        section = next((s for s in sections if s.id == mapping_id), None)
        if section is None:
            raise DieError(f"{prefix}pci ID '{mapping_id}' does not exist\n")
        deletes = [k for k in re.split(r"[,;\s]+", call.params.get("delete", "")) if k]
        for key in deletes:
            if key in call.params:
                raise DieError(f"{prefix}cannot set and delete property '{key}' at the same time!\n")
            if key == "map":
                raise DieError(f"{prefix}unable to delete required option 'map'\n")
        if "map" not in call.params:
            raise DieError(f"{prefix}missing value for required option 'map'\n")
        section.map = list(call.params["map"])
        section.options.update(_mapping_options(call.params))
        for key in deletes:
            section.options.pop(key, None)
        write_atomic(call.settings.path(MAPPING_CFG), write_mapping_cfg(sections))
    return None


def delete_mapping(call: Call) -> Json:
    with locked(call.settings):
        sections, _ = _mapping_state(call.settings)
        kept = [s for s in sections if s.id != call.path_params["id"]]
        if len(kept) != len(sections):
            write_atomic(call.settings.path(MAPPING_CFG), write_mapping_cfg(kept))
    return None


def _local_node(settings: Settings, node: str) -> None:
    if node not in (settings.node, "localhost"):
        raise DieError(
            f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
            "Name or service not known\n"
        )


# --- guest config files (qemu-server and pve-container writers) ---------------------------------------


@dataclass
class GuestConfig:
    main: dict[str, str]
    pending: dict[str, str]
    raw_lxc: list[tuple[str, str]]
    digest: str


def encode_text(text: str) -> str:
    return "".join(
        c if 0x20 <= ord(c) <= 0x7E and c != ":" else "".join(f"%{b:02X}" for b in c.encode()) for c in text
    )


def decode_text(text: str) -> str:
    return re.sub(r"(%[0-9A-Fa-f]{2})+", lambda m: bytes.fromhex(m.group(0).replace("%", "")).decode(), text)


def parse_guest_config(data: bytes, pending_header: str) -> GuestConfig:
    main: dict[str, str] = {}
    pending: dict[str, str] = {}
    raw: list[tuple[str, str]] = []
    target: dict[str, str] | None = main
    description: list[str] = []
    for line in data.decode().split("\n"):
        if line.startswith("["):
            target = pending if line.strip() == pending_header else None
            continue
        if target is None:
            continue
        if line.startswith("#"):
            if target is main:
                description.append(decode_text(line[1:]))
            continue
        lxc = re.fullmatch(r"(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*", line)
        if lxc and target is main:
            raw.append((lxc.group(1), lxc.group(3)))
            continue
        match = re.fullmatch(r"([a-z][a-z_\-]*\d*):\s*(.+?)\s*", line)
        if match:
            target[match.group(1)] = match.group(2)
    if description:
        main["description"] = "\n".join(description)
    return GuestConfig(main, pending, raw, sha1(data))


def write_guest_config(conf: GuestConfig, pending_header: str) -> str:
    def section(values: dict[str, str]) -> str:
        out = ""
        if "description" in values:
            out += "".join(f"#{encode_text(line)}\n" for line in values["description"].split("\n"))
        out += "".join(f"{k}: {values[k]}\n" for k in sorted(values) if k != "description")
        return out

    text = section(conf.main) + "".join(f"{k}: {v}\n" for k, v in conf.raw_lxc)
    if conf.pending:
        text += f"\n{pending_header}\n" + section(conf.pending)
    return text


QEMU_DIR = "/etc/pve/qemu-server"
LXC_DIR = "/etc/pve/lxc"


def _guest_path(call: Call, kind: str) -> Path:
    return call.settings.path(f"{QEMU_DIR if kind == 'qemu' else LXC_DIR}/{call.path_params['vmid']}.conf")


def _load_guest(call: Call, kind: str) -> GuestConfig:
    path = _guest_path(call, kind)
    if not path.is_file():
        folder = "qemu-server" if kind == "qemu" else "lxc"
        rel = f"nodes/{call.settings.node}/{folder}/{call.path_params['vmid']}.conf"
        raise DieError(f"Configuration file '{rel}' does not exist\n")
    return parse_guest_config(path.read_bytes(), "[PENDING]" if kind == "qemu" else "[pve:pending]")


def _typed(values: dict[str, str], keys: dict[str, P], indexed: dict[str, tuple[int, P]]) -> dict[str, Any]:
    """Config values as qemu-server/pve-container's check_type returns them: integers and booleans as
    numbers, everything else as strings."""
    result: dict[str, Any] = {}
    for key, value in values.items():
        schema = config_key_schema(key, keys, indexed)
        if schema is not None and schema.type == "integer" and re.fullmatch(r"[+-]?\d+", value):
            result[key] = int(value)
        elif schema is not None and schema.type == "boolean" and parse_boolean(value) is not None:
            result[key] = parse_boolean(value)
        else:
            result[key] = value
    return result


# --- endpoints: qemu ---------------------------------------------------------------------------------


def _qemu_extra(name: str) -> P | None:
    return config_key_schema(name, QEMU_KEYS, QEMU_INDEXED)


def _running_path(call: Call) -> Path:
    return call.settings.path(f"/run/qemu-server/{call.path_params['vmid']}.pid")


def _is_running(call: Call) -> bool:
    return _running_path(call).is_file()


def _config_keys(params: dict[str, Any]) -> dict[str, str]:
    skip = {
        "vmid",
        "node",
        "digest",
        "delete",
        "revert",
        "force",
        "skiplock",
    }
    return {k: str(v) for k, v in params.items() if k not in skip}


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")


def _next_disk(conf: GuestConfig) -> int:
    """The number of the next `vm-<vmid>-disk-<N>` volume: one past every volume the config names."""
    numbers = [int(n) for value in conf.main.values() for n in re.findall(r":vm-\d+-disk-(\d+)", value)]
    return max(numbers, default=-1) + 1


def _allocate_disks(call: Call, conf: dict[str, str], emit: Callable[[str], None], disk: int = 0) -> None:
    vmid = call.path_params.get("vmid") or str(call.params["vmid"])
    keys = sorted(k for k in conf if re.fullmatch(r"(efidisk|scsi|virtio|sata|ide)\d+", k))
    keys.sort(key=lambda k: not k.startswith("efidisk"))
    for key in keys:
        head, _, rest = conf[key].partition(",")
        head = head.removeprefix("file=")
        match = re.fullmatch(r"([a-zA-Z][\w\-.]*):(\d+(?:\.\d+)?)", head)
        if not match:
            continue
        storage, size = match.groups()
        if storage not in call.settings.storages:
            raise DieError(f"storage '{storage}' does not exist\n")
        options = [o for o in rest.split(",") if o]
        if key.startswith("efidisk"):
            efitype = next((o.split("=", 1)[1] for o in options if o.startswith("efitype=")), "2m")
            options.append(f"size={'4M' if efitype == '4m' else '128K'}")
        else:
            options.append(f"size={size}G")
        volume = f"{storage}:vm-{vmid}-disk-{disk}"
        disk += 1
        conf[key] = ",".join([volume, *options])
        emit(f"{key}: successfully created disk '{conf[key]}'")


def _mac(vmid: str, index: str) -> str:
    digest = hashlib.sha1(f"{vmid}:{index}".encode()).hexdigest().upper()
    return f"BC:24:11:{digest[0:2]}:{digest[2:4]}:{digest[4:6]}"


def _add_macs(vmid: str, conf: dict[str, str]) -> None:
    for key in [k for k in conf if re.fullmatch(r"net\d+", k)]:
        head, sep, rest = conf[key].partition(",")
        if "=" not in head and re.fullmatch(r"[a-z0-9]+", head):
            conf[key] = f"{head}={_mac(vmid, key)}{sep}{rest}"


def _boot_order(conf: dict[str, str]) -> str:
    def first(pattern: str, cdrom: bool) -> list[str]:
        keys = sorted((k for k in conf if re.fullmatch(pattern, k)), key=lambda k: (re.sub(r"\d", "", k), k))
        return [k for k in keys if ("media=cdrom" in conf[k]) == cdrom][:1]

    disks = first(r"(ide|sata|scsi|virtio)\d+", False)
    cdroms = first(r"(ide|sata|scsi)\d+", True)
    nets = sorted((k for k in conf if re.fullmatch(r"net\d+", k)), key=lambda k: int(k[3:]))[:1]
    return "order=" + ";".join(disks + cdroms + nets)


def create_qemu(call: Call) -> Json:
    settings = call.settings
    vmid = str(call.params["vmid"])
    call.path_params["vmid"] = vmid
    with locked(settings):
        for kind, folder in (("VM", QEMU_DIR), ("CT", LXC_DIR)):
            if settings.path(f"{folder}/{vmid}.conf").exists():
                raise DieError(
                    f"unable to create VM {vmid} - {kind} {vmid} already exists on node '{settings.node}'\n"
                )
        path = _guest_path(call, "qemu")
        write_atomic(path, "lock: create\n")

    def worker(emit: Callable[[str], None]) -> None:
        conf = _config_keys(call.params)
        try:
            _allocate_disks(call, conf, emit)
        except DieError as error:
            path.unlink()
            raise DieError(f"unable to create VM {vmid} - {error.text}") from None
        _add_macs(vmid, conf)
        conf.setdefault("boot", _boot_order(conf))
        conf["meta"] = f"creation-qemu={settings.version},ctime={int(time.time())}"
        conf["smbios1"] = f"uuid={uuid.uuid4()}"
        conf["vmgenid"] = str(uuid.uuid4())
        with locked(settings):
            write_atomic(path, write_guest_config(GuestConfig(conf, {}, [], ""), "[PENDING]"))

    return run_task(call, "qmcreate", vmid, worker)


def get_qemu_config(call: Call) -> Json:
    if "snapshot" in call.params and call.params.get("current"):
        message = "cannot use 'snapshot' parameter with 'current'"
        raise ParamError({"snapshot": message, "current": message})
    conf = _load_guest(call, "qemu")
    values = dict(conf.main)
    if not call.params.get("current"):
        values.update({k: v for k, v in conf.pending.items() if k != "delete"})
        for key in _pending_deletes(conf):
            values.pop(key, None)
    return {**_typed(values, QEMU_KEYS, QEMU_INDEXED), "digest": conf.digest}


def _pending_deletes(conf: GuestConfig) -> list[str]:
    return [k.lstrip("!") for k in conf.pending.get("delete", "").split(",") if k]


def _config_update(call: Call, schema: Callable[[str], P | None]) -> tuple[dict[str, str], list[str]]:
    """A config PUT's keys to set and keys to delete: `no options specified` when there are none, an
    unknown key to delete refused by `schema` (the guest type's key schema)."""
    changes = _config_keys(call.params)
    deletes = [k for k in re.split(r"[,;\s]+", call.params.get("delete", "")) if k]
    if not changes and not deletes and not call.params.get("revert"):
        raise DieError("no options specified\n")
    for key in deletes:
        if schema(key) is None:
            raise ParamError({"delete": f"unknown option '{key}'"})
    return changes, deletes


def update_qemu_config(call: Call) -> Json:  # noqa: PLR0912
    settings = call.settings
    vmid = call.path_params["vmid"]
    changes, deletes = _config_update(call, _qemu_extra)
    for key in deletes:
        if key in changes:
            raise ParamError({"delete": f"you can't use '-{key}' and -delete {key}' at the same time"})
    with locked(settings):
        conf = _load_guest(call, "qemu")
        if "digest" in call.params and call.params["digest"] != conf.digest:
            raise DieError("checksum mismatch (file change by other user?)\n")
        if "lock" in conf.main and not call.params.get("skiplock"):
            raise DieError(f"VM is locked ({conf.main['lock']})\n")
        shown = {**changes, **({"delete": ",".join(deletes)} if deletes else {})}
        sys.stdout.write(f"update VM {vmid}: " + " ".join(f"-{k} {shown[k]}" for k in sorted(shown)) + "\n")
        # As qemu-server's update: a `<storage>:<GiB>` disk is allocated, a new NIC gets a MAC.
        _allocate_disks(call, changes, _print_line, _next_disk(conf))
        _add_macs(vmid, changes)
        running = _is_running(call)
        for key in deletes:
            if key not in conf.main and key not in conf.pending:
                sys.stderr.write(f"cannot delete '{key}' - not set in current configuration!\n")
            elif running and key not in QEMU_FAST_PLUG:
                pending = [k for k in _pending_deletes(conf) if k != key]
                conf.pending["delete"] = ",".join(sorted([*pending, key]))
            else:
                conf.main.pop(key, None)
                conf.pending.pop(key, None)
        for key, value in changes.items():
            if running and key not in QEMU_FAST_PLUG:
                if conf.main.get(key) == value:
                    conf.pending.pop(key, None)
                else:
                    conf.pending[key] = value
            else:
                conf.main[key] = value
                conf.pending.pop(key, None)
        if conf.pending.get("delete") == "":
            del conf.pending["delete"]
        write_atomic(_guest_path(call, "qemu"), write_guest_config(conf, "[PENDING]"))
    return None


def _apply_pending(conf: GuestConfig) -> None:
    for key in _pending_deletes(conf):
        conf.main.pop(key, None)
    conf.main.update({k: v for k, v in conf.pending.items() if k != "delete"})
    conf.pending.clear()


def get_qemu_status(call: Call) -> Json:
    conf = _load_guest(call, "qemu")
    running = _is_running(call)
    values = conf.main
    memory = re.match(r"(?:current=)?(\d+)", values.get("memory", "512"))
    cores, sockets = int(values.get("cores", "1")), int(values.get("sockets", "1"))
    status: dict[str, Any] = {
        "vmid": int(call.path_params["vmid"]),
        "status": "running" if running else "stopped",
        "qmpstatus": "running" if running else "stopped",
        "name": values.get("name", f"VM {call.path_params['vmid']}"),
        "cpus": cores * sockets,
        "maxmem": int(memory.group(1) if memory else 512) * 1024 * 1024,
        **_IDLE_COUNTERS,
    }
    for key in ("lock", "tags"):
        if key in values:
            status[key] = values[key]
    if parse_boolean(values.get("agent", "0").split(",")[0].removeprefix("enabled=")) == 1:
        status["agent"] = 1
    if running:
        record = json.loads(_running_path(call).read_text())
        status["pid"] = record["pid"]
        status["uptime"] = max(0, int(time.time()) - record["started"])
        status["running-machine"] = record["machine"]
        status["running-qemu"] = "9.2.0"
    return status


def _passthrough(call: Call, conf: dict[str, str]) -> list[dict[str, Any]]:
    """qemu-server's start-time hostpci handling: parse, resolve mappings (assert_valid), reserve."""
    settings = call.settings
    is_q35 = "q35" in conf.get("machine", "").split(",")[0]
    sections = {s.id: s for s in _mapping_state(settings)[0]}
    keys = sorted((k for k in conf if re.fullmatch(r"hostpci\d+", k)), key=lambda k: int(k[7:]))
    if keys and not any((settings.sysfs_root / "class/iommu").glob("*")):
        raise DieError("cannot prepare PCI pass-through, IOMMU not present\n")
    used: set[str] = set()
    devices = []
    for key in keys:
        entry = parse_property_string(P(props=HOSTPCI_FMT, default_key="host"), conf[key])
        if "host" in entry and "mapping" in entry:
            raise DieError("Cannot set both 'host' and 'mapping'.\n")
        if "host" not in entry and "mapping" not in entry:
            raise DieError("Either 'host' or 'mapping' must be set.\n")
        pcie = parse_boolean(entry.get("pcie", "0")) == 1
        if pcie and not is_q35:
            raise DieError("q35 machine model is not enabled\n")
        alternatives: list[list[str]] = []
        if "mapping" in entry:
            name = entry["mapping"]
            section = sections.get(name)
            lines = [_map_entry(m) for m in section.map] if section else []
            mine = [m for m in lines if m.get("node") == settings.node]
            if not mine:
                raise DieError(f"PCI device mapping not found for '{name}'\n")
            for line in mine:
                try:
                    assert_valid(settings, name, line, section)
                except DieError as error:
                    raise DieError(
                        f"PCI device mapping invalid (hardware probably changed): {error.text}\n"
                    ) from None
                alternatives.append(line["path"].split(";"))
        else:
            alternatives.append(entry["host"].split(";"))
        chosen = next((p for alt in alternatives for p in alt if p not in used), None)
        if chosen is None:
            raise DieError(f"could not find a free device for '{key}'\n")
        used.add(chosen)
        functions = slot_functions(settings, chosen)
        if not functions:
            raise DieError(f"no PCI device found for '{chosen}'\n")
        devices.append({"hostpci": int(key[7:]), "pcie": pcie, "functions": functions})
    return devices


def _hypervisor(call: Call, request: dict[str, Any]) -> dict[str, Any]:
    """Ask the lab hypervisor (outside the node) to start/stop a VM's guest or a CT's container host; wait
    for its answer (requests: lab/pve/hypervisor.py)."""
    settings = call.settings
    if settings.hypervisor_dir is None:
        return {"ok": True, "pid": os.getpid()}
    folder = settings.hypervisor_dir
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{request['vmid']}-{request['action']}-{uuid.uuid4().hex[:8]}"
    write_atomic(folder / f"{name}.request", json.dumps(request, sort_keys=True))
    answer_path = folder / f"{name}.answer"
    deadline = time.monotonic() + settings.hypervisor_timeout_s
    while not answer_path.is_file():
        if time.monotonic() > deadline:
            (folder / f"{name}.request").unlink(missing_ok=True)
            raise DieError(f"lab hypervisor did not answer within {settings.hypervisor_timeout_s:.0f} s\n")
        time.sleep(0.1)
    answer: dict[str, Any] = json.loads(answer_path.read_text())
    answer_path.unlink()
    if not answer.get("ok"):
        raise DieError(f"start failed: {answer.get('error', 'lab hypervisor failed')}\n")
    return answer


def start_qemu(call: Call) -> Json:
    vmid = call.path_params["vmid"]

    def worker(_emit: Callable[[str], None]) -> None:
        with locked(call.settings):
            if not _guest_path(call, "qemu").is_file():
                raise DieError(
                    f"unable to find configuration file for VM {vmid} on node '{call.settings.node}'\n"
                )
            conf = _load_guest(call, "qemu")
            if parse_boolean(conf.main.get("template", "0")) == 1:
                raise DieError("you can't start a vm if it's a template\n")
            if "lock" in conf.main and not call.params.get("skiplock"):
                raise DieError(f"VM is locked ({conf.main['lock']})\n")
            if _is_running(call):
                raise DieError(f"VM {vmid} already running\n")
            staged = GuestConfig(dict(conf.main), dict(conf.pending), conf.raw_lxc, conf.digest)
            _apply_pending(staged)
            devices = _passthrough(call, staged.main)
            if conf.pending:
                write_atomic(_guest_path(call, "qemu"), write_guest_config(staged, "[PENDING]"))
        machine = staged.main.get("machine", "pc").split(",")[0]
        answer = _hypervisor(
            call,
            {
                "action": "start",
                "vmid": int(vmid),
                "name": staged.main.get("name"),
                "machine": machine,
                "devices": devices,
            },
        )
        record = {
            "pid": answer["pid"],
            "started": int(time.time()),
            "machine": "pc-q35-9.2+pve1" if "q35" in machine else "pc-i440fx-9.2+pve1",
        }
        write_atomic(_running_path(call), json.dumps(record))

    return run_task(call, "qmstart", vmid, worker)


def stop_qemu(call: Call, task_type: str) -> Json:
    vmid = call.path_params["vmid"]

    def worker(_emit: Callable[[str], None]) -> None:
        if not _guest_path(call, "qemu").is_file():
            raise DieError(
                f"unable to find configuration file for VM {vmid} on node '{call.settings.node}'\n"
            )
        if not _is_running(call):
            return
        _hypervisor(call, {"action": "stop", "vmid": int(vmid)})
        _running_path(call).unlink(missing_ok=True)

    return run_task(call, task_type, vmid, worker)


# --- endpoints: lxc ----------------------------------------------------------------------------------


def _lxc_extra(name: str) -> P | None:
    return config_key_schema(name, LXC_KEYS, LXC_INDEXED)


def get_lxc_config(call: Call) -> Json:
    conf = _load_guest(call, "lxc")
    values = dict(conf.main)
    if not call.params.get("current"):
        values.update({k: v for k, v in conf.pending.items() if k != "delete"})
        for key in _pending_deletes(conf):
            values.pop(key, None)
    result = {**_typed(values, LXC_KEYS, LXC_INDEXED), "digest": conf.digest}
    if conf.raw_lxc:
        result["lxc"] = [[k, v] for k, v in conf.raw_lxc]
    return result


def update_lxc_config(call: Call) -> Json:
    changes, deletes = _config_update(call, _lxc_extra)
    with locked(call.settings):
        conf = _load_guest(call, "lxc")
        if "digest" in call.params and call.params["digest"] != conf.digest:
            raise DieError("detected modified configuration - file changed by other user? Try again.\n")
        if "lock" in conf.main:
            raise DieError(f"CT is locked ({conf.main['lock']})\n")
        if "unprivileged" in changes:
            raise DieError("unable to modify read-only option: 'unprivileged'\n")
        for key, value in changes.items():
            if re.fullmatch(r"dev\d+", key):
                _check_device(call.settings, value)
            conf.main[key] = value
        for key in deletes:
            conf.main.pop(key, None)
        write_atomic(_guest_path(call, "lxc"), write_guest_config(conf, "[pve:pending]"))
    return None


def _lxc_running_path(call: Call) -> Path:
    return call.settings.path(f"/run/lxc/{call.path_params['vmid']}.running")


def create_lxc(call: Call) -> Json:
    """`vzcreate` (§6.1): vmid free, `ostemplate` required, `rootfs <storage>:<GiB>` allocated, `devN`
    checked against the node's device nodes, `net0` normalised; the template is not unpacked (stand-in)."""
    settings = call.settings
    vmid = str(call.params["vmid"])
    call.path_params["vmid"] = vmid
    if "ostemplate" not in call.params:
        raise ParamError({"ostemplate": "property is missing and it is not optional"})
    with locked(settings):
        for kind, folder in (("VM", QEMU_DIR), ("CT", LXC_DIR)):
            if settings.path(f"{folder}/{vmid}.conf").exists():
                raise DieError(f"{kind} {vmid} already exists on node '{settings.node}'\n")
        path = _guest_path(call, "lxc")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, "lock: create\n")

    def worker(emit: Callable[[str], None]) -> None:
        conf = _config_keys(call.params)
        template = conf.pop("ostemplate")
        # Proxmox writes them to the root's authorized_keys, not the config; the lab's container host
        # already has the lab's key.
        conf.pop("ssh-public-keys", None)
        try:
            match = re.fullmatch(r"([a-zA-Z][\w\-.]*):(\d+)", conf.get("rootfs", "local:4"))
            if not match or match.group(1) not in settings.storages:
                raise DieError(f"storage '{conf.get('rootfs', '').split(':')[0]}' does not exist\n")
            for key, value in conf.items():
                if re.fullmatch(r"dev\d+", key):
                    _check_device(settings, value)
        except DieError as error:
            path.unlink()
            raise DieError(f"unable to create CT {vmid} - {error.text}") from None
        conf["rootfs"] = f"{match.group(1)}:vm-{vmid}-disk-0,size={match.group(2)}G"
        conf.setdefault("unprivileged", "1")
        conf["arch"] = "amd64"
        conf["ostype"] = "debian"
        for key in [k for k in conf if re.fullmatch(r"net\d+", k)]:
            fields = dict(part.split("=", 1) for part in conf[key].split(","))
            fields.setdefault("hwaddr", _mac(vmid, key))
            fields.setdefault("type", "veth")
            order = ["name", "bridge", "hwaddr", "ip", "type"]
            conf[key] = ",".join(
                f"{k}={fields[k]}" for k in [*order, *sorted(set(fields) - set(order))] if k in fields
            )
        emit(f"extracting archive '{template}' (LAB STAND-IN: not unpacked)")
        emit("Detected container architecture: amd64")
        with locked(settings):
            write_atomic(path, write_guest_config(GuestConfig(conf, {}, [], ""), "[pve:pending]"))

    return run_task(call, "vzcreate", vmid, worker)


def get_lxc_status(call: Call) -> Json:
    conf = _load_guest(call, "lxc")
    running = _lxc_running_path(call).is_file()
    vmid = int(call.path_params["vmid"])
    return {
        "vmid": vmid,
        "type": "lxc",
        "status": "running" if running else "stopped",
        "name": conf.main.get("hostname", f"CT{vmid}"),
        "cpus": int(conf.main.get("cores", "1")),
        "maxmem": int(conf.main.get("memory", "512")) * 1024 * 1024,
        "maxswap": int(conf.main.get("swap", "512")) * 1024 * 1024,
        "swap": 0,
        **_IDLE_COUNTERS,
    }


def _dev_entries(conf: dict[str, str]) -> list[dict[str, str]]:
    """The `devN` entries of a CT config, in index order, as property dicts (path, gid, uid, mode, ...)."""
    keys = sorted((k for k in conf if re.fullmatch(r"dev\d+", k)), key=lambda k: int(k[3:]))
    return [parse_property_string(P(props=DEV_FMT, default_key="path"), conf[k]) for k in keys]


def start_lxc(call: Call) -> Json:
    """`vzstart` (§6.4): `CT <vmid> already running` before the fork; devN checked again at start. The lab
    hypervisor starts the container lab host with those device nodes; its refusal fails the task with
    `start failed: <message>`. The stand-in records the container as running (its status)."""
    vmid = call.path_params["vmid"]
    conf = _load_guest(call, "lxc")
    if _lxc_running_path(call).is_file():
        raise DieError(f"CT {vmid} already running\n")

    def worker(_emit: Callable[[str], None]) -> None:
        if "lock" in conf.main and not call.params.get("skiplock"):
            raise DieError(f"CT is locked ({conf.main['lock']})\n")
        for key, value in conf.main.items():
            if re.fullmatch(r"dev\d+", key):
                _check_device(call.settings, value)
        request = {"action": "start", "type": "lxc", "vmid": int(vmid), "dev": _dev_entries(conf.main)}
        _hypervisor(call, request)
        running = _lxc_running_path(call)
        running.parent.mkdir(parents=True, exist_ok=True)
        running.write_text(f"{int(time.time())}\n")

    return run_task(call, "vzstart", vmid, worker)


def stop_lxc(call: Call) -> Json:
    """`vzstop` (§6.4): `CT <vmid> not running` before the fork."""
    vmid = call.path_params["vmid"]
    _load_guest(call, "lxc")
    if not _lxc_running_path(call).is_file():
        raise DieError(f"CT {vmid} not running\n")

    def worker(_emit: Callable[[str], None]) -> None:
        _hypervisor(call, {"action": "stop", "type": "lxc", "vmid": int(vmid)})
        _lxc_running_path(call).unlink(missing_ok=True)

    return run_task(call, "vzstop", vmid, worker)


def _check_device(settings: Settings, value: str) -> None:
    entry = parse_property_string(P(props=DEV_FMT, default_key="path"), value)
    path = entry.get("path", "")
    if not path.startswith("/dev/") or "/." in path:
        raise DieError(f"{path} is not a valid device path\n")
    try:
        mode = settings.path(path).stat().st_mode
    except FileNotFoundError:
        raise DieError(f"Device {path} does not exist\n") from None
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
        raise DieError(f"{path} is not a device\n")


# --- routing -----------------------------------------------------------------------------------------

NODE_P = P(optional=False, verify=verify_node)
VMID_P = P(type="integer", optional=False, verify=verify_vmid, minimum=100, maximum=999999999)
MAPPING_P: dict[str, P] = {
    "map": P(type="array", optional=False, items=P(props=MAP_FMT)),
    "description": P(max_length=4096),
    "mdev": BOOL,
    "live-migration-capable": BOOL,
}
QEMU_UPDATE_P = {
    "delete": P(verify=verify_configid_list, list_format=True),
    "revert": P(verify=verify_configid_list, list_format=True),
    "force": BOOL,
    "digest": P(max_length=40),
    "skiplock": BOOL,
}

ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"version", Endpoint("GET", {}, get_version)),
    ("get", r"cluster/mapping/pci", Endpoint("GET", {"check-node": P(verify=verify_node)}, list_mappings)),
    (
        "create",
        r"cluster/mapping/pci",
        Endpoint(
            "POST", {"id": P(optional=False, verify=verify_configid), **MAPPING_P}, create_mapping, True
        ),
    ),
    ("get", r"cluster/mapping/pci/(?P<id>[^/]+)", Endpoint("GET", {}, get_mapping)),
    (
        "set",
        r"cluster/mapping/pci/(?P<id>[^/]+)",
        Endpoint(
            "PUT",
            {
                **MAPPING_P,
                "map": P(type="array", items=P(props=MAP_FMT)),
                "delete": P(verify=verify_configid_list, list_format=True),
                "digest": P(max_length=64),
            },
            update_mapping,
            True,
        ),
    ),
    ("delete", r"cluster/mapping/pci/(?P<id>[^/]+)", Endpoint("DELETE", {}, delete_mapping, True)),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu",
        Endpoint(
            "POST",
            {"vmid": VMID_P},
            create_qemu,
            extra=_qemu_extra,
        ),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/config",
        Endpoint("GET", {"current": BOOL, "snapshot": P()}, get_qemu_config),
    ),
    (
        "set",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/config",
        Endpoint("PUT", QEMU_UPDATE_P, update_qemu_config, True, extra=_qemu_extra),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/current",
        Endpoint("GET", {}, get_qemu_status),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/start",
        Endpoint("POST", {"skiplock": BOOL, "timeout": P(type="integer", minimum=0)}, start_qemu),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/stop",
        Endpoint(
            "POST",
            {
                "skiplock": BOOL,
                "timeout": P(type="integer", minimum=0),
                "keepActive": BOOL,
                "overrule-shutdown": BOOL,
            },
            lambda call: stop_qemu(call, "qmstop"),
        ),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/shutdown",
        Endpoint(
            "POST",
            {
                "skiplock": BOOL,
                "timeout": P(type="integer", minimum=0),
                "forceStop": BOOL,
                "keepActive": BOOL,
            },
            lambda call: stop_qemu(call, "qmshutdown"),
        ),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/config",
        Endpoint("GET", {"current": BOOL, "snapshot": P()}, get_lxc_config),
    ),
    (
        "set",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/config",
        Endpoint(
            "PUT",
            {k: v for k, v in QEMU_UPDATE_P.items() if k in ("delete", "revert", "digest")},
            update_lxc_config,
            True,
            extra=_lxc_extra,
        ),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc",
        Endpoint(
            "POST",
            {"vmid": VMID_P, "ostemplate": P(), "ssh-public-keys": P(max_length=65536)},
            create_lxc,
            extra=_lxc_extra,
        ),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/current",
        Endpoint("GET", {}, get_lxc_status),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/start",
        Endpoint("POST", {"skiplock": BOOL, "debug": BOOL}, start_lxc),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/stop",
        Endpoint("POST", {"skiplock": BOOL, "overrule-shutdown": BOOL}, stop_lxc),
    ),
    ("get", r"nodes/(?P<node>[^/]+)/tasks/(?P<upid>[^/]+)/status", Endpoint("GET", {}, get_task_status)),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/tasks",
        Endpoint(
            "GET",
            {
                "vmid": P(type="integer", minimum=100),
                "typefilter": P(),
                "source": P(enum=("archive", "active", "all")),
                "limit": P(type="integer", minimum=0),
            },
            list_tasks,
        ),
    ),
]
PATH_PARAMS: dict[str, P] = {
    "node": NODE_P,
    "vmid": VMID_P,
    "id": P(optional=False, verify=verify_configid),
    "upid": P(optional=False),
}


def find_route(cmd: str, path: str) -> tuple[Endpoint, dict[str, str]] | None:
    clean = path.strip("/")
    for route_cmd, pattern, endpoint in ROUTES:
        match = re.fullmatch(pattern, clean)
        if route_cmd == cmd and match:
            return endpoint, match.groupdict()
    return None


def fail(text: str, code: int = 255) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.write(text)
    sys.stderr.flush()
    raise SystemExit(code)


def main(argv: list[str]) -> int:  # noqa: PLR0912
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(HELP)
        return 0
    cmd = argv[0]
    if cmd not in CMDS:
        fail(f"ERROR: unknown command 'pvesh {cmd}'\n{HELP}")
    if len(argv) < 2:
        fail(f"400 not enough arguments\npvesh {cmd} <api_path> [OPTIONS] [FORMAT_OPTIONS]\n")
    path = argv[1]
    found = find_route(cmd, path)
    if found is None:
        fail(f"No '{cmd}' handler defined for '{path}'\n", 1)
    endpoint, path_values = found
    try:
        raw, output = parse_options(argv[2:], endpoint)
    except OptionError as error:
        fail(
            "".join(f"{line}\n" for line in error.lines)
            + "400 unable to parse option\n"
            + usage(cmd, endpoint)
            + "\n"
        )
    settings = load_settings()
    errors: dict[str, str] = {}
    for key, value in path_values.items():
        check_value(key, PATH_PARAMS[key], value, errors)
    params: dict[str, Any] = {}
    for key, value in raw.items():
        schema = schema_of(endpoint, key)
        assert schema is not None
        params[key] = check_value(key, schema, value, errors)
    for key, schema in endpoint.params.items():
        if not schema.optional and key not in raw:
            _add(errors, key, "property is missing and it is not optional")
    try:
        if errors:
            raise ParamError(errors)
        if "node" in path_values:
            _local_node(settings, path_values["node"])
        result = endpoint.handler(Call(settings, dict(path_values), params))
    except ParamError as error:
        lines = "".join(f"{k}: {v}\n" for k, v in sorted(error.errors.items()))
        fail(f"400 Parameter verification failed.\n{lines}{usage(cmd, endpoint)}\n")
    except DieError as error:
        fail(error.text)
    if endpoint.returns_null:
        return 0
    if output == "json-pretty":
        sys.stdout.write(json.dumps(result, sort_keys=True, indent=3, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
