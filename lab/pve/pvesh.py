#!/usr/bin/python3
"""pvesh: the pvegpu lab's STAND-IN for Proxmox VE's `pvesh`. This is NOT Proxmox.

Installed into lab Proxmox nodes as /usr/bin/pvesh (Debian's python3, stdlib only). It answers the API calls
pvegpu makes, the way `pvesh` does (shared/knowledge/proxmox-api-behaviour.md is the spec):

    pvesh <get|set|create|delete> <api_path> [--opt value]... [--output-format json|json-pretty]

- success: compact JSON with sorted keys + "\\n" on stdout (nothing for calls that return null); handler
  output (qemu PUT's `update VM ...`, task output) comes first;
- async calls (VM create, destroy, start, stop, shutdown) run to completion, then print their UPID; a
  failed task prints its error on stderr and still exits 0; `GET /nodes/{node}/tasks/{upid}/status` reads
  the log, which the worker writes as it runs: a worker killed mid-way (pvesh killed) leaves a log without a
  `TASK ...` line, its status is then `stopped` with exitstatus `unexpected status`, as in Proxmox;
  `GET /nodes/{node}/tasks` lists the tasks (newest first; `vmid`, `typefilter`, `source`, `limit`);
- a VM/CT create writes the stub config `lock: create` before its worker runs, and the worker replaces it
  with the final config; every write and start refuses a locked guest (`VM is locked (create)`) until the
  lock is removed (`qm unlock <vmid>` / `pct unlock <vmid>` on a real node; in the lab: `pvesh set
  .../config --delete lock --skiplock 1`); `DELETE /nodes/{node}/qemu/{vmid}` (task `qmdestroy`:
  `skiplock`, `purge`, `destroy-unreferenced-disks`) destroys a VM and its volumes (`destroy_qemu`;
  without `purge`, a VM in /etc/pve/ha/resources.cfg or /etc/pve/replication.cfg is refused);
- errors: `400 Parameter verification failed.` + one `<param>: <msg>` line each + the usage line; plain
  `die` texts; `Unknown option: <name>`; `No '<cmd>' handler defined for '<path>'` (exit 1); else exit 255.
- storage (pve-storage): `GET /storage` (`type`), `GET /storage/{storage}` (with `digest`), `PUT
  /storage/{storage}` (`content`, `disable`, `delete`, `digest`; answers `{"storage","type"}`; errors
  prefixed `update storage failed: `; a content type the plugin lacks is dropped with a stderr warning),
  `GET /nodes/{node}/storage/{storage}/content` (`content`, `vmid`: `{volid, format, size, ctime, content,
  vmid?, used?}` sorted by volid), `DELETE /nodes/{node}/storage/{storage}/content/{volume}` (task
  `imgdel`: a volid, slashes and all, or a volname of `{storage}`; Datastore.Allocate), `POST
  /nodes/{node}/storage/{storage}/download-url` (task `download`, id the file name: `url`, `content`
  iso|vztmpl|import, `filename`, `checksum` + `checksum-algorithm`,
  `compression`, `verify-certificates`; fetched with urllib; a file already there with the right checksum
  is kept, "no need to download");
- volumes: a data file per volume: dir storages under their `path` (images/<vmid>/vm-<vmid>-disk-<N>.<fmt>,
  import/, snippets/, template/iso, template/cache; volids `local:<vmid>/<name>`, `local:import/<file>`),
  other storages <root>/var/lib/pvegpu-lab/volumes/<storage>/<name> (volids `<storage>:vm-<vmid>-disk-<N>`);
  a plain allocation is an empty file, `<storage>:0,import-from=<volid>` copies the source (size: a qcow2
  header's virtual size, else the file's), `<storage>:cloudinit` makes `vm-<vmid>-cloudinit`;
  `PUT /nodes/{node}/qemu/{vmid}/resize` (task `resize`: `disk`, `size` `<N>[KMGT]` or `+<N>[KMGT]`)
  rewrites `size=` (the stand-in's volume size is the `size=` its config records);
- cloud-init keys (citype, ciuser, cipassword (masked on GET), sshkeys (URL-encoded, each line a key),
  ipconfigN, nameserver, searchdomain, ciupgrade, cicustom) with qemu-server's schema checks; a VM start
  with a `vm-<vmid>-cloudinit` drive reads every cicustom volume (Cloudinit.pm's errors) and hands the lab
  hypervisor the user-data (the `user` snippet, else Proxmox's generated user-data);
- VM start request to the lab hypervisor: {"action": "start", "vmid", "name", "machine" (conf or
  "pc"), "bios" (conf or "seabios"), "mac" (net0's), "devices", "disk": null | {"key", "volume", "path"
  (data file, a path on the node)}, "cloud_init": null | {"user_data", "ipconfig0", "hostname", "mac"
  (net0's)}, "config" (the VM's config as started: the hypervisor builds QEMU's command line from it)};
  each device: {"hostpci", "pcie", "functions", "vendors", "classes" (each function's sysfs values)}; an
  answer's `"guest": null` (nothing boots) still leaves the VM running; a refusal's `log` lines (QEMU's
  stderr) go to the task log before its `start failed: <error>`;
- guest agent (`agent` must be set, the VM running, the agent "running": the hypervisor's
  <root>/var/lib/pvegpu-lab/agent/<vmid>.json): `GET .../agent/network-get-interfaces` answers that file;
  `GET .../agent/get-fsinfo` (answers `{"result": <result>}`), `GET .../agent/file-read` (`file`, `count`,
  `decode`, `offset`), `POST .../agent/file-write` (`file`, `content`, `encode`; the hypervisor gets the
  decoded content), `POST .../agent/exec` (`command` repeated, `input-data`), `GET .../agent/exec-status`
  (`pid`) are asked of the hypervisor as {"action": "agent", "vmid", "command", "params"}; the latter four
  answer its `result` as is; its `error` fails the call with `Agent error: <error>`.

State lives in Proxmox's file formats under the configured root: /etc/pve/mapping/pci.cfg,
/etc/pve/storage.cfg (when absent: what the installer writes, `local` dir + `local-lvm` lvmthin),
/etc/pve/qemu-server/<vmid>.conf, /etc/pve/lxc/<ctid>.conf, /var/log/pve/tasks/. PCI hardware is read from
the configured sysfs root. A VM start runs the VM's `hookscript` (`pre-start`, validated like
check_hookscript, its output in the task log, a non-zero exit refusing the start), then checks every mapped
path against that sysfs like Proxmox does, then asks the lab hypervisor (lab/pve/hypervisor.py, outside
the node) to bring the guest lab host up (it first has real QEMU parse the command line qemu-server would
build: lab/pve/qemu_check.py; a refusal fails the start); a CT start checks every `devN` device node, then
asks it to bring the container lab host up. Stops ask it to stop them.

Permissions: a call is made by `Call.rpcenv.user` (access.py's RpcEnv): root@pam under pvesh (every check
passes), the API token under the pveproxy stand-in (`call_api`). Each endpoint's `permissions` clause
(`PERMISSIONS`) is checked before its parameters; the handlers check what qemu-server, pve-container,
pve-storage and pve-manager check inside (`check_vm_modify_config_perm`: keys outside its lists, e.g.
`hookscript`, `args`, `hugepages`, `affinity`, `lock`, are root@pam's only on create, update and delete;
`check_hostpci_perm`: `host=` root's only, `mapping=` Mapping.Use; `skiplock` root's only; storage and
volume access; a CT's `devN` and `hookscript` root's only; other users' tasks need Sys.Audit); each accepted
guest config write is logged (`<user> <METHOD> <path> <keys>`) in /var/log/pvegpu-lab/api-writes.log. The
UPID's user is the caller (a token: `user@realm!name`; its task status splits it into `user` and
`tokenid`). `GET /access/permissions` answers as pve-access-control does.

Settings: JSON file $PVEGPU_LAB_PVE_CONFIG (default /etc/pvegpu-lab/pve.json), keys: node (required),
sysfs_root ("/sys"), root ("/": prefix of every state path), hypervisor_dir (null: VMs only change state),
hypervisor_timeout_s (180), version ("9.0.3"), release ("9.0"). The storages are storage.cfg's.

Not modelled: other endpoints and options (e.g. VM create's `start`, `pool`; unpacking a CT's template: the
container lab host is a Debian root, whatever `ostemplate` says), pools and their permissions, proxying
to other nodes, HA, hotplug (a running VM keeps every change but
name/description/onboot/tags/protection pending), PCI vendor/device names, output formats other than
json/json-pretty (the default prints json-pretty), a real QEMU process (a running VM is a
placeholder process in the node, argv `/usr/bin/kvm ... -id <vmid> -pidfile /var/run/qemu-server/<vmid>.pid`
over python3, that wrote its bare PID to that pidfile and lives while the file names it: what qemu-server's
`check_running` reads); storage: other storage types' volumes
(LVM, ZFS: files under /var/lib/pvegpu-lab/volumes), `nodes` restrictions, backups in content listings,
creating/deleting storages, download-url's image check (`qemu-img info` on an `import` file) and its
`zst`/`lzo` decompression; import-from: `qemu-img convert` (the data file is copied as is), another VM's
disk in use; cloud-init: building the cloud-init ISO (the hypervisor gets the texts), network-config and
meta-data, `cipassword` hashing; agent commands other than those above.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING or __package__:
    from lab.pve import access, ha
else:  # a script (/usr/bin/pvesh's launcher, the tests): access.py and ha.py lie beside it
    import access
    import ha

CONFIG_ENV = "PVEGPU_LAB_PVE_CONFIG"
DEFAULT_CONFIG = "/etc/pvegpu-lab/pve.json"
HELP = """\
pvesh - the pvegpu lab's STAND-IN for Proxmox VE's pvesh (not Proxmox; see /usr/bin/pvesh's docstring)

USAGE: pvesh <get|set|create|delete> <api_path> [OPTIONS] [--output-format json|json-pretty]

Endpoints: /version, /access/permissions, /cluster/mapping/pci[/{id}], /storage[/{storage}],
/nodes/{node}/qemu, /nodes/{node}/qemu/{vmid} (delete), /nodes/{node}/qemu/{vmid}/config,
/nodes/{node}/qemu/{vmid}/status/{current|start|stop|shutdown},
/nodes/{node}/qemu/{vmid}/resize,
/nodes/{node}/qemu/{vmid}/agent/{network-get-interfaces|get-fsinfo|file-read|file-write|exec|exec-status},
/nodes/{node}/storage/{storage}/{content|download-url},
/nodes/{node}/storage/{storage}/content/{volume} (delete),
/nodes/{node}/lxc[/{vmid}/config|/{vmid}/status/{current|start|stop}],
/nodes/{node}/tasks, /nodes/{node}/tasks/{upid}/status, /nodes/{node}/tasks/{upid}/log
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
    )


# --- parameter schema (PVE::JSONSchema) -----------------------------------------------------------

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
    requires: str | None = None  # another key that must be set with this one


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
    check_requires(path, props, value, errors)


def check_requires(path: str, props: dict[str, P], value: dict[str, Any], errors: dict[str, str]) -> None:
    """JSONSchema::check_object's `requires`: `<path.other>: missing property required by '<path.key>'`."""
    prefix = f"{path}." if path else ""
    for key in value:
        required = props[key].requires if key in props else None
        if required is not None and required not in value:
            _add(errors, f"{prefix}{required}", f"missing property required by '{prefix}{key}'")


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
    """One API call: `rpcenv` says who makes it (root@pam under pvesh; the API token under pveproxy)."""

    settings: Settings
    path_params: dict[str, str]
    params: dict[str, Any]
    out: list[str] = field(default_factory=list)
    rpcenv: access.RpcEnv = field(default_factory=access.RpcEnv)


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


# --- /etc/pve/storage.cfg (PVE::Storage::Plugin, a SectionConfig) and volumes -------------------------

STORAGE_CFG = "/etc/pve/storage.cfg"
# What the Proxmox VE installer writes (LVM-thin install); the stand-in reads it when the file is absent.
DEFAULT_STORAGE_CFG = (
    "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\n"
    "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir,images\n\n"
)
FILE_STORAGE_TYPES = ("dir", "nfs", "cifs", "cephfs", "btrfs")  # plugins with a `path`
STORAGE_TYPES = ("btrfs", "cephfs", "cifs", "dir", "lvm", "lvmthin", "nfs", "rbd", "zfspool")
REQUIRED_OPTIONS = {
    "dir": ("path",),
    "lvmthin": ("thinpool", "vgname"),
    "lvm": ("vgname",),
    "zfspool": ("pool",),
}
BOOLEAN_OPTIONS = ("disable", "shared")
LAB_VOLUMES = "/var/lib/pvegpu-lab/volumes"  # non-file storages' volumes: <storage>/<name>
SUBDIRS = {
    "images": "images",
    "rootdir": "private",
    "iso": "template/iso",
    "vztmpl": "template/cache",
    "backup": "dump",
    "snippets": "snippets",
    "import": "import",
}
ISO_EXT = r"\.(?:iso|img)"
VZTMPL_EXT = r"\.(?:(tar)(?!\.)|tar\.(gz|xz|zst|bz2))"
IMPORT_EXT = r"\.(ova|ovf|qcow2|raw|vmdk)"
UPLOAD_IMPORT_EXT = r"\.(ova|qcow2|raw|vmdk)"
SAFE_CHARS = r"[a-zA-Z0-9\-.+=_]"
IMAGE_FORMATS = ("raw", "qcow2", "vmdk", "subvol")


@dataclass
class Storage:
    """One storage.cfg section: `options` in file order, values as written (`content` a comma list)."""

    id: str
    type: str
    options: dict[str, str]

    @property
    def content(self) -> list[str]:
        default = "images,rootdir"  # every plugin's default content ($def->{content}->[1])
        return [c for c in re.split(r"[,;\s]+", self.options.get("content", default)) if c]

    @property
    def valid_content(self) -> tuple[str, ...]:
        return CONTENT_TYPES if self.type in FILE_STORAGE_TYPES else ("images", "rootdir")

    @property
    def path(self) -> str | None:
        return self.options.get("path") if self.type in FILE_STORAGE_TYPES else None


def parse_storage_cfg(text: str) -> list[Storage]:
    """Sections in file order; Plugin::parse_config adds a `local` dir storage when none is defined."""
    storages: list[Storage] = []
    current: Storage | None = None
    for line in text.split("\n"):
        if re.match(r"\s*#", line):
            continue
        if line.strip() == "":
            current = None
            continue
        header = re.fullmatch(r"(\S+):\s*(\S+)\s*", line)
        if current is None and header:
            current = Storage(header.group(2), header.group(1).lower(), {})
            storages.append(current)
            continue
        prop = re.fullmatch(r"\s+(\S+)(\s+(.*\S))?\s*", line)
        if current is not None and prop is not None:
            # SectionConfig::parse_config: a repeated key is a "duplicate attribute", the first value kept
            current.options.setdefault(prop.group(1), prop.group(3) if prop.group(3) is not None else "1")
    if not any(s.id == "local" and s.type == "dir" for s in storages):
        storages = [s for s in storages if s.id != "local"]
        content = "backup,images,iso,rootdir,snippets,vztmpl"
        local = {"path": "/var/lib/vz", "content": content, "prune-backups": "keep-all=1"}
        storages.insert(0, Storage("local", "dir", local))
    return storages


def write_storage_cfg(storages: list[Storage]) -> str:
    """SectionConfig::write_config: `disable` first, the type's required options, then the rest sorted."""
    out = []
    for s in storages:
        out.append(f"{s.type}: {s.id}\n")
        if s.options.get("disable") == "1":
            out.append("\tdisable\n")
        required = REQUIRED_OPTIONS.get(s.type, ())
        rest = sorted(k for k in s.options if k not in required and k != "disable")
        out.extend(f"\t{k} {s.options[k]}\n" for k in [*required, *rest] if k in s.options)
        out.append("\n")
    return "".join(out)


def _storage_state(settings: Settings) -> tuple[list[Storage], str]:
    path = settings.path(STORAGE_CFG)
    data = path.read_bytes() if path.is_file() else DEFAULT_STORAGE_CFG.encode()
    return parse_storage_cfg(data.decode()), sha1(data)


def storage_config(settings: Settings, storage_id: str) -> Storage:
    """PVE::Storage::storage_config: the section, or `storage '<id>' does not exist`."""
    for storage in _storage_state(settings)[0]:
        if storage.id == storage_id:
            return storage
    raise DieError(f"storage '{storage_id}' does not exist\n")


@dataclass(frozen=True)
class Volume:
    """A parsed volume id: its content type (`vtype`), its name, owner, format and data file (a path on
    the node; `Settings.path` maps it into the stand-in's root)."""

    volid: str
    storage: Storage
    vtype: str
    name: str
    vmid: str | None
    format: str
    file: str


def parse_volume(settings: Settings, volid: str) -> Volume:
    """PVE::Storage::parse_volname and path, with the plugins' texts for names they cannot parse."""
    match = VOLUME_ID.fullmatch(volid)
    if not match:
        raise DieError(f"unable to parse volume ID '{volid}'\n")
    storage = storage_config(settings, match.group(1))
    volname = match.group(2)
    if storage.path is None:
        lvm = re.fullmatch(r"((?:vm|base)-(\d+)-\S+)", volname)
        if not lvm:
            raise DieError(f"unable to parse lvm volume name '{volname}'\n")
        fmt = "qcow2" if volname.endswith(".qcow2") else "raw"
        file = f"{LAB_VOLUMES}/{storage.id}/{volname}"
        return Volume(volid, storage, "images", volname, lvm.group(2), fmt, file)
    image = re.fullmatch(r"(\d+)/(\S+)", volname)
    if image:
        name_match = re.fullmatch(r"(?:base|vm)-(\d+)-\S+\.(raw|qcow2|vmdk|subvol)", image.group(2))
        if not name_match:
            raise DieError(f"unable to parse volume filename '{image.group(2)}'\n")
        file = f"{storage.path}/images/{image.group(1)}/{image.group(2)}"
        return Volume(volid, storage, "images", image.group(2), image.group(1), name_match.group(1), file)
    patterns = (
        ("iso", rf"iso/([^/]+{ISO_EXT})", None),
        ("vztmpl", rf"vztmpl/([^/]+{VZTMPL_EXT})", None),
        ("backup", r"backup/([^/]+\.(?:tgz|(?:tar|vma)(?:\.(?:gz|lzo|zst|bz2))?))", None),
        ("snippets", r"snippets/([^/]+)", None),
        ("import", rf"import/([ a-zA-Z0-9\-.+=_]+{IMPORT_EXT})", 2),
    )
    for vtype, pattern, format_group in patterns:
        found = re.fullmatch(pattern, volname)
        if found:
            fmt = found.group(format_group) if format_group else "raw"
            file = f"{storage.path}/{SUBDIRS[vtype]}/{found.group(1)}"
            return Volume(volid, storage, vtype, found.group(1), None, fmt, file)
    raise DieError(f"unable to parse directory volume name '{volname}'\n")


def image_size(data_file: Path) -> int:
    """The size of an image file: a qcow2 header's virtual size (bytes 24-31, big endian), else its length."""
    with data_file.open("rb") as handle:
        header = handle.read(32)
    if len(header) == 32 and header[:4] == b"QFI\xfb":
        return int.from_bytes(header[24:32], "big")
    return data_file.stat().st_size


def allocate_volume(
    settings: Settings, storage: Storage, vmid: str, fmt: str, *, first: int, name: str = ""
) -> tuple[str, Path]:
    """PVE::Storage::vdisk_alloc: a free `vm-<vmid>-disk-<N>` (or `name`) on `storage`, its data file
    created empty; returns the volume id and the data file (in the stand-in's root)."""
    number = first
    while True:
        base = name or f"vm-{vmid}-disk-{number}"
        if storage.path is not None:
            volid, file = f"{storage.id}:{vmid}/{base}.{fmt}", f"{storage.path}/images/{vmid}/{base}.{fmt}"
        else:
            volid, file = f"{storage.id}:{base}", f"{LAB_VOLUMES}/{storage.id}/{base}"
        data = settings.path(file)
        if name or not data.exists():
            data.parent.mkdir(parents=True, exist_ok=True)
            data.write_bytes(b"")
            return volid, data
        number += 1


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
        elif key not in current.options:  # SectionConfig: a repeated key is a duplicate, the first kept
            _mapping_option(current.options, key, value)
    return [s for s in sections if s.map]


def _mapping_option(options: dict[str, Any], key: str, value: str | None) -> None:
    if key in ("mdev", "live-migration-capable"):
        if value is None or value in ("0", "1"):
            options[key] = 1 if value is None else int(value)
    elif key == "description" and value is not None:
        options[key] = value


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
    """PVE::Mapping::PCI::assert_valid: raises DieError with Proxmox's text (ending in "\\n"). Each of the
    line's `;`-separated paths is checked (one device set: one alternative), the IOMMU group on the first."""
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
    """fork_worker under pvesh (sync): worker output to stdout and the log; returns the UPID. A worker line
    `WARN: <text>` is a warning (RESTEnvironment `warn`, `log_warn`): a task that logged N of them and did
    not die ends `TASK WARNINGS: N`, which pve-common's UPID.pm `status_is_error` counts as success."""
    settings = call.settings
    pid = os.getpid()
    starttime = f"{int(time.time()):08X}"
    user = call.rpcenv.user  # the UPID names who started the task (a token: `user@realm!name`)
    upid = f"UPID:{settings.node}:{pid:08X}:{_pstart(pid):08X}:{starttime}:{task_type}:{task_id}:{user}:"
    log_path = task_log_path(settings, upid, starttime)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")  # the log exists while the task runs: a killed worker leaves it unfinished

    warnings = 0

    def emit(line: str) -> None:
        nonlocal warnings
        warnings += line.startswith("WARN: ")
        with log_path.open("a") as log:
            log.write(line + "\n")
        sys.stdout.write(line + "\n")

    status = "OK"
    try:
        worker(emit)
        ending = f"TASK WARNINGS: {warnings}\n" if warnings else "TASK OK\n"
        status = f"WARNINGS: {warnings}" if warnings else status
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
    if not _owns_task(call.rpcenv, user):  # Tasks.pm read_task_status
        call.rpcenv.check(call.rpcenv.user, f"/nodes/{call.path_params.get('node', node)}", ("Sys.Audit",))
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
    if split := access.split_tokenid(user):  # Tasks.pm $convert_token_task
        result["user"], result["tokenid"] = split
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


def get_task_log(call: Call) -> Json:
    """`GET /nodes/{node}/tasks/{upid}/log` (pve-manager API2/Tasks.pm read_task_log, PVE::Tools
    dump_logfile): the log's lines as `{n, t}`, `n` counting from 1, from line `start` (0-based), at most
    `limit` of them (50 by default, 0: all); the same checks as the task's status."""
    upid = call.path_params["upid"]
    match = UPID_RE.fullmatch(upid)
    if not match:
        raise ParamError({"upid": "unable to parse worker upid"})
    node, _, _, _, start_hex, _, _, user = match.groups()
    log_path = task_log_path(call.settings, upid, start_hex)
    if not log_path.is_file():
        raise ParamError({"upid": "no such task"})
    if not _owns_task(call.rpcenv, user):
        call.rpcenv.check(call.rpcenv.user, f"/nodes/{call.path_params.get('node', node)}", ("Sys.Audit",))
    lines = log_path.read_text().splitlines()
    start, limit = int(call.params.get("start", 0)), int(call.params.get("limit", 50))
    shown = lines[start:] if limit == 0 else lines[start : start + limit]
    return [{"n": start + index + 1, "t": line} for index, line in enumerate(shown)]


def _owns_task(rpcenv: access.RpcEnv, task_user: str) -> bool:
    """Tasks.pm $check_task_user: a token sees its own tasks, a user its own and its tokens'."""
    split = access.split_tokenid(task_user)
    return rpcenv.user == task_user or (split is not None and rpcenv.user == split[0])


def list_tasks(call: Call) -> Json:
    """`GET /nodes/{node}/tasks`: every task with a log, newest first; an ended one (its log has a `TASK`
    line, or its process is gone) with `status` (its exit status, as the status endpoint gives it) and
    `endtime` (the log's mtime). Filters: `vmid`, `typefilter`, `limit` (default 50); `source` is accepted,
    every task being listed (this stand-in keeps no separate active list)."""
    tasks = []
    rpcenv = call.rpcenv
    auditor = rpcenv.check(rpcenv.user, f"/nodes/{call.path_params['node']}", ("Sys.Audit",), noerr=True)
    for log_path in call.settings.path("/var/log/pve/tasks").glob("*/UPID:*"):
        upid = log_path.name
        match = UPID_RE.fullmatch(upid)
        if match is None or not (auditor or _owns_task(rpcenv, match.group(8))):
            continue
        task = get_task_status(Call(call.settings, {"upid": upid}, {}))
        if "vmid" in call.params and task["id"] != str(call.params["vmid"]):
            continue
        if call.params.get("typefilter") not in (None, task["type"]):
            continue
        entry = {
            key: task[key]
            for key in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user", "tokenid")
            if key in task
        }
        if task["status"] != "stopped":  # an active task: its user as the UPID has it
            entry["user"] = match.group(8)
            entry.pop("tokenid", None)
        if task["status"] == "stopped":
            entry.update(status=task["exitstatus"], endtime=int(log_path.stat().st_mtime))
        tasks.append(entry)
    tasks.sort(key=lambda task: (task["starttime"], task["upid"]), reverse=True)
    return tasks[: int(call.params.get("limit", 50))]


# --- endpoints: version --------------------------------------------------------------------------------


def get_version(call: Call) -> Json:
    s = call.settings
    return {"release": s.release, "repoid": sha1(s.version.encode())[:8], "version": s.version}


def get_access_permissions(call: Call) -> Json:
    """API2/AccessControl.pm permissions: `userid`'s (default: the caller's) privileges, path ->
    {privilege: propagate (1/0)}, on `path` or on every path that matters (get_effective_permissions);
    another user's (but one's own tokens') needs Sys.Audit on /access."""
    authid = call.rpcenv.user
    userid = call.params.get("userid", authid)
    owner = access.split_tokenid(userid)
    if userid != authid and (owner is None or owner[0] != authid):
        call.rpcenv.check(authid, "/access", ("Sys.Audit",))
    rpcenv = access.RpcEnv(authid, access.read_user_cfg(call.settings.root))
    if "path" in call.params:
        found = {call.params["path"]: rpcenv.permissions(userid, call.params["path"])}
    else:
        found = rpcenv.effective_permissions(userid)
    return {path: {priv: int(prop) for priv, prop in privs.items()} for path, privs in found.items()}


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
    rpcenv = call.rpcenv  # Mapping/PCI.pm index: only the ids with Mapping.Modify, Use or Audit
    privs = ("Mapping.Modify", "Mapping.Use", "Mapping.Audit")
    for section in sections:
        if not rpcenv.check_any(rpcenv.user, f"/mapping/pci/{section.id}", privs, noerr=True):
            continue
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


# --- endpoints: storage (pve-storage API2/Storage/{Config,Content,Status}.pm) ----------------------------


def _storage_json(storage: Storage, digest: str) -> dict[str, Any]:
    """Config.pm's $api_storage_config: the options (booleans as numbers) plus storage, type, digest."""
    result: dict[str, Any] = {k: int(v) if k in BOOLEAN_OPTIONS else v for k, v in storage.options.items()}
    result.update(storage=storage.id, type=storage.type, digest=digest, content=",".join(storage.content))
    return result


def list_storages(call: Call) -> Json:
    storages, digest = _storage_state(call.settings)
    wanted = call.params.get("type")
    rpcenv = call.rpcenv  # Config.pm index: only storages with Datastore.Audit or AllocateSpace
    privs = ("Datastore.Audit", "Datastore.AllocateSpace")
    return [
        _storage_json(s, digest)
        for s in storages
        if wanted in (None, s.type) and rpcenv.check_any(rpcenv.user, f"/storage/{s.id}", privs, noerr=True)
    ]


def get_storage(call: Call) -> Json:
    digest = _storage_state(call.settings)[1]
    return _storage_json(storage_config(call.settings, call.path_params["storage"]), digest)


def update_storage(call: Call) -> Json:
    """Config.pm `update` under lock_storage_config: every error gets `update storage failed: `; a content
    type the plugin does not support is dropped with a warning (stderr), as Plugin::decode_value does."""
    prefix = "update storage failed: "
    storage_id = call.path_params["storage"]
    with locked(call.settings):
        storages, digest = _storage_state(call.settings)
        try:
            if call.params.get("digest") and call.params["digest"] != digest:
                raise DieError("detected modified configuration - file changed by other user? Try again.\n")
            storage = next((s for s in storages if s.id == storage_id), None)
            if storage is None:
                raise DieError(f"storage '{storage_id}' does not exist\n")
            changes = {k: v for k, v in call.params.items() if k not in ("digest", "delete")}
            if "content" in changes:
                changes["content"] = _decoded_content(storage, changes["content"])
            if "disable" in changes:
                changes["disable"] = str(changes["disable"])
            deletes = [k for k in re.split(r"[,;\s]+", call.params.get("delete", "")) if k]
            for key in deletes:
                if key not in (
                    "content",
                    "disable",
                    "nodes",
                    "shared",
                    "prune-backups",
                    *REQUIRED_OPTIONS.get(storage.type, ()),
                ):
                    raise DieError(f"no such option '{key}'\n")
                if key in REQUIRED_OPTIONS.get(storage.type, ()):
                    raise DieError(f"unable to delete required option '{key}'\n")
                if key in changes:
                    raise DieError(f"cannot set and delete property '{key}' at the same time!\n")
        except DieError as error:
            raise DieError(prefix + error.text) from None
        for key in deletes:
            storage.options.pop(key, None)
        storage.options.update(changes)
        write_atomic(call.settings.path(STORAGE_CFG), write_storage_cfg(storages))
    return {"storage": storage.id, "type": storage.type}


def _decoded_content(storage: Storage, value: str) -> str:
    kept: list[str] = []
    for content in [c for c in re.split(r"[,;\s]+", value) if c]:
        if content not in storage.valid_content:
            sys.stderr.write(f"storage does not support content type '{content}'\n")
        elif content not in kept:
            kept.append(content)
    if "none" in kept and len(kept) > 1:
        raise DieError("unable to combine 'none' with other content types\n")
    if not kept:
        raise DieError("storage does not support content type 'none'\n")
    return ",".join(kept)


def list_storage_content(call: Call) -> Json:
    """Storage::volume_list: the content types asked for that the storage has, sorted by volid."""
    settings = call.settings
    storage = storage_config(settings, call.path_params["storage"])
    wanted = [call.params["content"]] if "content" in call.params else list(SUBDIRS)
    vmid = str(call.params["vmid"]) if "vmid" in call.params else None
    result: list[dict[str, Any]] = []
    for content in [c for c in wanted if c in storage.content]:
        if content in ("images", "rootdir"):
            items = [i for i in _list_images(settings, storage, vmid) if i["content"] == content]
        elif storage.path is not None and content in ("iso", "vztmpl", "snippets", "import", "backup"):
            if vmid is not None and content in ("iso", "vztmpl"):
                continue
            items = _list_files(settings, storage, content)
        else:
            continue
        result.extend(items)
    if not call.rpcenv.is_root:  # Content.pm index: each volume the caller may access
        result = [item for item in result if _may_access(call, item["volid"])]
    return sorted(result, key=lambda item: item["volid"].lower())


def _may_access(call: Call, volid: str) -> bool:
    try:
        check_volume_access(call, volid, None)
    except (DieError, access.PermissionDenied):
        return False
    return True


def _list_images(settings: Settings, storage: Storage, vmid: str | None) -> list[dict[str, Any]]:
    if storage.path is not None:
        pattern, folder = r"(\d+)/((?:vm|base)-(\d+)-\S+\.(raw|qcow2|vmdk|subvol))", f"{storage.path}/images"
        files = [f"{p.parent.name}/{p.name}" for p in settings.path(folder).glob("[0-9]*/*")]
    else:
        pattern, folder = r"()((?:vm|base)-(\d+)-\S+)()", f"{LAB_VOLUMES}/{storage.id}"
        files = [p.name for p in settings.path(folder).glob("*")]
    items = []
    for rel in files:
        match = re.fullmatch(pattern, rel)
        if not match or (vmid is not None and match.group(3) != vmid):
            continue
        owner = match.group(3)
        data = settings.path(f"{folder}/{rel}")
        volid = f"{storage.id}:{rel}"
        is_ct = settings.path(f"{LXC_DIR}/{owner}.conf").is_file()
        item = {
            "volid": volid,
            "format": match.group(4) or "raw",
            "size": _volume_size(settings, volid, owner, data),
            "used": data.stat().st_size,
            "vmid": int(owner),
            "ctime": int(data.stat().st_ctime),
            "content": "rootdir" if is_ct else "images",
        }
        items.append(item)
    return items


def _volume_size(settings: Settings, volid: str, owner: str, data: Path) -> int:
    """A volume's size: the `size=` its guest's config records (the stand-in's volumes are small files),
    else its image size."""
    for folder in (QEMU_DIR, LXC_DIR):
        conf = read_bytes(settings.path(f"{folder}/{owner}.conf")).decode()
        for line in conf.splitlines():
            found = re.match(rf"[a-z]+\d+: (?:file=)?{re.escape(volid)},(?:.*,)?size=([^,]+)", line)
            if found and parse_size(found.group(1)) is not None:
                return parse_size(found.group(1)) or 0
    return image_size(data)


def _list_files(settings: Settings, storage: Storage, content: str) -> list[dict[str, Any]]:
    """Plugin.pm $get_subdir_files: the files of a content type's directory that its pattern accepts."""
    folder = settings.path(f"{storage.path}/{SUBDIRS[content]}")
    items = []
    for data in sorted(folder.glob("*")) if folder.is_dir() else []:
        if data.is_dir():
            continue
        name = data.name
        if content == "iso":
            if not re.fullmatch(rf"[^/]+{ISO_EXT}", name, re.IGNORECASE):
                continue
            item: dict[str, Any] = {"volid": f"{storage.id}:iso/{name}", "format": "iso"}
        elif content == "vztmpl":
            found = re.fullmatch(rf"[^/]+{VZTMPL_EXT}", name)
            if not found:
                continue
            fmt = "tar" if found.group(1) else f"t{found.group(2)}"
            item = {"volid": f"{storage.id}:vztmpl/{name}", "format": fmt}
        elif content == "snippets":
            item = {"volid": f"{storage.id}:snippets/{name}", "format": "snippet"}
        elif content == "import":
            found = re.fullmatch(rf"{SAFE_CHARS}+{IMPORT_EXT}", name, re.IGNORECASE)
            if not found:
                continue
            item = {"volid": f"{storage.id}:import/{name}", "format": found.group(1)}
        else:
            continue  # backups: not modelled
        stat_result = data.stat()
        item.update(size=stat_result.st_size, ctime=int(stat_result.st_ctime), content=content)
        items.append(item)
    return items


def parse_size(text: str) -> int | None:
    """JSONSchema::parse_size: `<N>[KMGT]` (or `KiB`...) in bytes."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT](?:iB)?)?", text)
    if not match:
        return None
    factor = 1024 ** ("BKMGT".index(match.group(2)[0]) if match.group(2) else 0)
    return int(float(match.group(1)) * factor)


def format_size(size: int) -> str:
    """JSONSchema::format_size: the largest unit that divides the size."""
    text = str(size)
    for unit in "KMGT":
        if size % 1024:
            return text
        size //= 1024
        text = f"{size}{unit}"
    return text


def delete_volume(call: Call) -> Json:
    """Content.pm `delete` (task `imgdel`, id `<owner>@<storage>`): `{volume}` is a volid (its storage must
    be `{storage}`: `storage ID mismatch (a != b)`) or a volname on `{storage}`; Datastore.Allocate on the
    storage (backups: not modelled); vdisk_free: a data file that is not there is a warning (Plugin.pm
    free_image), the task still ends."""
    storeid, volume = call.path_params["storage"], call.path_params["volume"]
    if ":" in volume:
        match = VOLUME_ID.fullmatch(volume)
        if match is None:
            raise ParamError({"volume": f"unable to parse volume ID '{volume}'"})
        if match.group(1) != storeid:
            raise ParamError({"volume": f"storage ID mismatch ({match.group(1)} != {storeid})"})
        volid = volume
    else:
        volid = f"{storeid}:{volume}"
    found = parse_volume(call.settings, volid)
    call.rpcenv.check(call.rpcenv.user, f"/storage/{found.storage.id}", ("Datastore.Allocate",))
    data = call.settings.path(found.file)

    def worker(emit: Callable[[str], None]) -> None:
        with locked(call.settings):
            if not data.is_file():
                emit(f"WARN: disk image '{found.file}' does not exist")
            data.unlink(missing_ok=True)
            emit(f"Removed volume '{volid}'")

    owner = f"{found.vmid}@" if found.vmid is not None else ""
    return run_task(call, "imgdel", f"{owner}{found.storage.id}", worker)


def download_url(call: Call) -> Json:
    """Status.pm `download_url`: checks before the task, then Tools::download_file_from_url in the task
    `download` (worker id: the file name). The stand-in fetches with urllib instead of wget."""
    settings, params = call.settings, call.params
    storage = storage_config(settings, call.path_params["storage"])
    if storage.options.get("disable") == "1":
        raise DieError(f"storage '{storage.id}' is disabled\n")
    if storage.path is None:
        raise DieError(f"can't upload to storage type '{storage.type}', not a file based storage!\n")
    content = params["content"]
    if content not in storage.content:
        raise DieError(f"storage '{storage.id}' is not configured for content-type '{content}'\n")
    # PVE::Storage::normalize_content_filename: chomp, the part after the last (back)slash, then every
    # character outside [a-zA-Z0-9_.-] made `_`; the file (and its volume) has that name.
    filename = re.sub(r"[^a-zA-Z0-9_.-]", "_", re.sub(r"^.*[/\\]", "", params["filename"].removesuffix("\n")))
    if content == "iso" and not re.search(rf"[^/]+{ISO_EXT}$", filename, re.IGNORECASE):
        raise ParamError({"filename": "wrong file extension"})
    if content == "vztmpl" and not re.search(rf"[^/]+{VZTMPL_EXT}$", filename, re.IGNORECASE):
        raise ParamError({"filename": "wrong file extension"})
    if content == "import" and not re.search(rf"{SAFE_CHARS}+{UPLOAD_IMPORT_EXT}$", filename):
        raise ParamError({"filename": "invalid filename or wrong extension"})
    dest = f"{storage.path}/{SUBDIRS[content]}/{filename}"
    settings.path(dest).parent.mkdir(parents=True, exist_ok=True)

    def worker(emit: Callable[[str], None]) -> None:
        if "compression" in params and content != "iso":
            raise DieError(f"decompression not supported for {content}\n")
        _download(params, settings.path(dest), dest, emit)

    return run_task(call, "download", filename, worker)


def _download(params: dict[str, Any], target: Path, dest: str, emit: Callable[[str], None]) -> None:
    url, algorithm = params["url"], params.get("checksum-algorithm")
    expected = str(params.get("checksum", ""))
    emit(f"downloading {url} to {dest}")
    if target.exists():
        if not algorithm:
            raise DieError(f"refusing to override existing file '{dest}'\n")
        got = _file_hash(algorithm, target)
        if got == expected.lower():
            emit("calculating checksum of existing file...OK, got correct file already, no need to download")
            return
        emit("calculating checksum of existing file...")
        raise DieError(f"checksum mismatch: got '{got}' != expect '{expected}', aborting\n")
    # Imported here: only a download needs them, and every other call would pay their import (~25 ms).
    import ssl  # noqa: PLC0415
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    partial = target.with_name(f"{target.name}.tmp_dwnl.{os.getpid()}")
    context = ssl.create_default_context()
    if not params.get("verify-certificates", 1):
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        try:
            with urllib.request.urlopen(url, timeout=60, context=context) as answer:
                partial.write_bytes(answer.read())
        except (OSError, ValueError) as error:
            # wget's exit codes: 8 = the server answered with an error, 4 = network failure.
            code = 8 if isinstance(error, urllib.error.HTTPError) else 4
            command = f"wget --progress=dot:giga -O {dest}.tmp_dwnl.{os.getpid()} {url}"
            raise DieError(f"download failed: command '{command}' failed: exit code {code}\n") from None
        if algorithm:
            got = _file_hash(algorithm, partial)
            if got != expected.lower():
                emit("calculating checksum...")
                raise DieError(f"checksum mismatch: got '{got}' != expect '{expected}'\n")
            emit("calculating checksum...OK, checksum verified")
        if "compression" in params:
            partial.write_bytes(_decompressed(params["compression"], partial.read_bytes()))
        partial.rename(target)
    finally:
        partial.unlink(missing_ok=True)
    emit(f"download of '{url}' to '{dest}' finished")


def _file_hash(algorithm: str, path: Path) -> str:
    return hashlib.new(algorithm, path.read_bytes()).hexdigest()


def _decompressed(compression: str, data: bytes) -> bytes:
    import bz2  # noqa: PLC0415  (only a download needs them, as above)
    import gzip  # noqa: PLC0415

    if compression == "gz":
        return gzip.decompress(data)
    if compression == "bz2":
        return bz2.decompress(data)
    raise DieError(f"decompression of '{compression}' is not modelled by the lab stand-in\n")


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


QEMU_RUN_DIR = "/var/run/qemu-server"  # qemu-server Helpers.pm $var_run_tmpdir (vm_pidfile_name)
QEMU_RECORD_DIR = "/var/lib/pvegpu-lab/qemu"  # the stand-in's own: <vmid>.json, start time and machine
# The running VM's process: python3 named /usr/bin/kvm (qemu-server's parse_cmdline wants `kvm$` or
# `qemu-*`), writing its PID to the pidfile as QEMU's -pidfile does, alive while the file names it. One line
# (parse_cmdline reads /proc/<pid>/cmdline as a line).
_PLACEHOLDER = (
    "import os,time;f={path!r};t=f+'.tmp';open(t,'w').write('%d\\n'%os.getpid());os.replace(t,f);"
    "any(time.sleep(1) for _ in iter(lambda:open(f).read()=='%d\\n'%os.getpid(),False))"
)


def qemu_pidfile(vmid: str) -> str:
    """PVE::QemuServer::Helpers::vm_pidfile_name."""
    return f"{QEMU_RUN_DIR}/{vmid}.pid"


def _running_path(call: Call) -> Path:
    return call.settings.path(qemu_pidfile(call.path_params["vmid"]))


def _record_path(call: Call) -> Path:
    return call.settings.path(f"{QEMU_RECORD_DIR}/{call.path_params['vmid']}.json")


def qemu_running_pid(settings: Settings, vmid: str) -> int | None:
    """PVE::QemuServer::Helpers `instance_running_locally` (via `vm_running_locally`): the PID the VM's
    pidfile holds (a first line of digits) when /proc/<pid>/cmdline (read as one line, split at NUL) is a
    `kvm`/`qemu-*` command whose `-pidfile` is that pidfile and /proc/<pid>/stat is not a zombie's; else
    None."""
    pidfile = qemu_pidfile(vmid)
    try:
        first = settings.path(pidfile).read_text().split("\n")[0]
    except (OSError, UnicodeDecodeError):
        return None
    if not re.fullmatch(r"[0-9]+", first):
        return None
    try:
        params = Path(f"/proc/{first}/cmdline").read_bytes().split(b"\n")[0].split(b"\0")
        state = Path(f"/proc/{first}/stat").read_text().rpartition(") ")[2].split(" ")[0]
    except OSError:
        return None
    command = params[0].decode(errors="replace")
    if not re.search(r"kvm$", command) and not re.search(r"(?:^|/)qemu-[^/]+$", command):
        return None
    options: dict[str, str | None] = {}
    pending: str | None = None
    for raw in params:
        param = raw.decode(errors="replace")
        if not param or param == "0":
            continue  # Perl's `next if !$p`
        if option := re.fullmatch(r"--?(.*)", param, re.DOTALL):
            if pending is not None:
                options[pending] = None
            pending = option.group(1)
        elif pending is not None:
            options[pending], pending = param, None
    if options.get("pidfile") != pidfile or state in ("", "Z"):
        return None
    return int(first)


def _is_running(call: Call) -> bool:
    return qemu_running_pid(call.settings, call.path_params["vmid"]) is not None


def _start_placeholder(call: Call, name: str) -> int:
    """The running VM's process (QEMU_RUN_DIR's comment), detached (its own session, reparented to the
    node's init); returns its PID once it wrote the pidfile, as QEMU's -daemonize returns."""
    vmid = call.path_params["vmid"]
    path = _running_path(call)
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["/usr/bin/kvm", "-c", _PLACEHOLDER.format(path=str(path)), "-id", vmid, "-name", name]
    argv += ["-pidfile", qemu_pidfile(vmid), "-daemonize"]
    read_end, write_end = os.pipe()
    if os.fork() == 0:  # the child starts the process and exits: its parent becomes init
        os.setsid()
        child = subprocess.Popen(
            argv,
            executable=sys.executable,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        os.write(write_end, str(child.pid).encode())
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32) or b"0")
    os.close(read_end)
    os.wait()
    deadline = time.monotonic() + 10
    while qemu_running_pid(call.settings, vmid) != pid:
        if time.monotonic() > deadline:
            raise DieError(f"start failed: the VM process {pid} did not write {qemu_pidfile(vmid)}\n")
        time.sleep(0.02)
    return pid


def _stop_placeholder(call: Call) -> None:
    """End the running VM's process (SIGTERM) and wait until it is gone; QEMU removes its pidfile as it
    exits, the stand-in does it for it."""
    pid = qemu_running_pid(call.settings, call.path_params["vmid"])
    _running_path(call).unlink(missing_ok=True)
    _record_path(call).unlink(missing_ok=True)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split(" ")[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.02)


@contextmanager
def vm_config_locked(settings: Settings, vmid: str, timeout_s: float = 10.0) -> Iterator[None]:
    """PVE::AbstractConfig `lock_config` (QemuConfig `config_file_lock`, 10 s): the VM's config lock, an
    flock on /var/lock/qemu-server/lock-<vmid>.conf; PVE::Tools `lock_file_full`'s texts when it waits or
    times out."""
    name = f"/var/lock/qemu-server/lock-{vmid}.conf"
    lock = settings.path(name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write("trying to acquire lock...\n")
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise DieError(f"can't lock file '{name}' - got timeout\n") from None
                    time.sleep(0.05)
            sys.stderr.write(" OK\n")
        yield


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


DRIVE_KEY = re.compile(r"(efidisk|scsi|virtio|sata|ide|tpmstate)\d+")
NEW_DISK = re.compile(r"(([^/:\s]+):)?(\d+(\.\d+)?)")
IMPORT_SYNTAX = "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"
EFIVARS_SIZE = {"4m": "4M", "2m": "128K"}


@dataclass
class Drive:
    """A drive property string: its volume (`file`) and its other options."""

    file: str
    options: dict[str, str]

    @classmethod
    def parse(cls, value: str) -> Drive:
        head, _, rest = value.partition(",")
        options = {o.partition("=")[0]: o.partition("=")[2] for o in rest.split(",") if o}
        return cls(head.removeprefix("file="), options)

    def print(self) -> str:
        """QemuServer::print_drive: the volume, then the options sorted (print_property_string)."""
        return ",".join([self.file, *(f"{k}={v}" for k, v in sorted(self.options.items()))])

    @property
    def is_cloudinit(self) -> bool:
        return (
            re.search(r"[:/](?:vm-\d+-)?cloudinit(?:\.(?:raw|qcow2|vmdk|qed|cow|vdi|cloop))?$", self.file)
            is not None
        )

    @property
    def is_cdrom(self) -> bool:
        return self.options.get("media") == "cdrom"


def _drive_keys(conf: dict[str, str]) -> list[str]:
    return sorted(k for k in conf if DRIVE_KEY.fullmatch(k))


def check_drives(settings: Settings, changes: dict[str, str]) -> None:
    """API2/Qemu.pm $check_drive_param, then $check_storage_access, before any lock or task (400s on the
    drive's key, a missing storage as a plain error)."""
    for key in _drive_keys(changes):
        drive = Drive.parse(changes[key])
        if "import-from" in drive.options:
            new = NEW_DISK.fullmatch(drive.file)
            if not new or float(new.group(3)) != 0:
                raise ParamError({key: IMPORT_SYNTAX})
            for required in ("efitype", "pre-enrolled-keys") if key == "efidisk0" else ():
                if required not in drive.options:
                    raise ParamError({key: f"need to specify '{required}' when using 'import-from'"})
    for key in _drive_keys(changes):
        _check_storage_access(settings, key, Drive.parse(changes[key]))


def _check_storage_access(settings: Settings, key: str, drive: Drive) -> None:
    volume = VOLUME_ID.fullmatch(drive.file)
    new = NEW_DISK.fullmatch(drive.file)
    if drive.file in ("none", "cloudinit", "cdrom") or (volume and volume.group(2) == "cloudinit"):
        pass
    elif new:
        if new.group(2) is None:
            raise DieError("no storage ID specified (and no default storage)\n")
        if "images" not in storage_config(settings, new.group(2)).content:
            raise ParamError({"storage": f"storage '{new.group(2)}' does not support vm images"})
    elif volume and parse_volume(settings, drive.file).vtype not in ("images", "iso"):
        raise ParamError({key: "content type needs to be 'images' or 'iso'"})
    source = drive.options.get("import-from")
    if source is not None and VOLUME_ID.fullmatch(source):
        vtype = parse_volume(settings, source).vtype
        if vtype not in ("images", "import"):
            raise ParamError({key: f"{source} has wrong type '{vtype}' - needs to be 'images' or 'import'"})


def validate_ssh_keys(encoded: str) -> None:
    """PVE::Tools::validate_ssh_public_keys on the URL-decoded value: `ssh-keygen -l` must accept every
    non-empty line (here: a known key type followed by base64 whose blob names that type)."""
    for line in urllib.parse.unquote(encoded).split("\n"):
        if line.strip() and not _is_public_key(line):
            raise DieError("SSH public key validation error\n")


SSH_KEY_TYPES = (
    "ssh-rsa",
    "ssh-dss",
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)


def _is_public_key(line: str) -> bool:
    tokens = line.split()
    for index, token in enumerate(tokens[:-1]):
        if token in SSH_KEY_TYPES:
            try:
                blob = base64.b64decode(tokens[index + 1], validate=True)
            except ValueError:
                return False
            length = int.from_bytes(blob[:4], "big")
            return blob[4 : 4 + length] == token.encode()
    return False


def _next_disk(conf: GuestConfig) -> int:
    """The number of the next `vm-<vmid>-disk-<N>` volume: one past every volume the config names."""
    numbers = [int(n) for value in conf.main.values() for n in re.findall(r"[:/]vm-\d+-disk-(\d+)", value)]
    return max(numbers, default=-1) + 1


@dataclass
class Allocation:
    """create_disks' running state: the next disk number, the data files made (freed on error)."""

    vmid: str
    next_disk: int
    files: list[Path] = field(default_factory=list)

    def free(self) -> None:
        for data in self.files:
            data.unlink(missing_ok=True)


def allocate_disks(
    settings: Settings,
    conf: dict[str, str],
    existing: dict[str, str],
    emit: Callable[[str], None],
    allocation: Allocation,
) -> None:
    """API2/Qemu.pm create_disks: `<storage>:<GiB>` allocates, `<storage>:0,import-from=<source>` copies
    the source, `<storage>:cloudinit` makes the cloud-init drive; each prints `<key>: successfully created
    disk '<value>'`. `existing`: the config the drives join (a second cloud-init drive is refused)."""
    for key in _drive_keys(conf):
        drive = Drive.parse(conf[key])
        volume = VOLUME_ID.fullmatch(drive.file)
        if volume and volume.group(2) == "cloudinit":
            _cloudinit_drive(settings, key, drive, {**existing, **conf}, allocation)
        elif NEW_DISK.fullmatch(drive.file):
            _new_disk(settings, key, drive, emit, allocation)
        else:
            continue
        conf[key] = drive.print()
        emit(f"{key}: successfully created disk '{conf[key]}'")


def _cloudinit_drive(
    settings: Settings, key: str, drive: Drive, conf: dict[str, str], allocation: Allocation
) -> None:
    other = next((k for k in _drive_keys(conf) if k != key and Drive.parse(conf[k]).is_cloudinit), None)
    if other is not None:
        raise DieError(f"{key} - cloud-init drive is already attached at '{other}'\n")
    storage = storage_config(settings, drive.file.split(":")[0])
    fmt = drive.options.pop("format", "qcow2")
    name = f"vm-{allocation.vmid}-cloudinit" + (f".{fmt}" if storage.path is not None else "")
    drive.file = _allocate(settings, storage, allocation, fmt, name)[0]
    drive.options["media"] = "cdrom"


def _allocate(
    settings: Settings, storage: Storage, allocation: Allocation, fmt: str, name: str = ""
) -> tuple[str, Path]:
    volid, data = allocate_volume(
        settings, storage, allocation.vmid, fmt, first=allocation.next_disk, name=name
    )
    allocation.files.append(data)
    number = re.search(r"disk-(\d+)", volid)
    if number and not name:
        allocation.next_disk = int(number.group(1)) + 1
    return volid, data


def _new_disk(
    settings: Settings, key: str, drive: Drive, emit: Callable[[str], None], allocation: Allocation
) -> None:
    new = NEW_DISK.fullmatch(drive.file)
    assert new is not None
    storage = storage_config(settings, new.group(2))
    source = drive.options.pop("import-from", None)
    fmt = drive.options.pop("format", None)
    if source is None:
        volid, _ = _allocate(settings, storage, allocation, fmt or "raw")
        size = int(float(new.group(3)) * 1024**3)
    else:
        source_file, source_format = _import_source(settings, source)
        if storage.path is None:
            fmt = "raw"
        elif fmt is None:
            fmt = source_format if source_format in ("raw", "qcow2", "vmdk") else "raw"
        if VOLUME_ID.fullmatch(source):
            emit(f"create full clone of drive ({source})")
        volid, data = _allocate(settings, storage, allocation, fmt)
        data.write_bytes(source_file.read_bytes())
        size = image_size(source_file)
    drive.file = volid
    if key == "efidisk0":
        drive.options["size"] = EFIVARS_SIZE.get(drive.options.get("efitype", "2m"), "128K")
    else:
        drive.options["size"] = format_size(size)


def _import_source(settings: Settings, source: str) -> tuple[Path, str]:
    """The data file and format of an `import-from` source, with create_disks' and $import_from_volid's
    texts when it is missing."""
    if not VOLUME_ID.fullmatch(source):
        data = settings.path(source)
        if not source.startswith("/") or not data.is_file():
            raise DieError(f"can't find file '{source}'\n")
        return data, "raw"
    volume = parse_volume(settings, source)
    data = settings.path(volume.file)
    if volume.vtype == "import":
        if not data.is_file():
            raise DieError(f"failed to stat '{volume.file}'\n")
        return data, volume.format
    if not data.is_file():
        raise DieError(f"cannot import from '{source}' - could not get size of {source}\n")
    if Drive(source, {}).is_cloudinit:
        raise DieError(f"cannot import from '{source}' - cannot import from cloudinit disk\n")
    return data, volume.format


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
    if "sshkeys" in call.params:
        validate_ssh_keys(call.params["sshkeys"])
    check_qemu_create_perms(call, vmid, _config_keys(call.params))
    if "tags" in call.params:
        assert_tag_permissions(call, vmid, None, call.params["tags"])
    check_drives(settings, _config_keys(call.params))
    with locked(settings):
        for kind, folder in (("VM", QEMU_DIR), ("CT", LXC_DIR)):
            if settings.path(f"{folder}/{vmid}.conf").exists():
                raise DieError(
                    f"unable to create VM {vmid} - {kind} {vmid} already exists on node '{settings.node}'\n"
                )
        path = _guest_path(call, "qemu")
        write_atomic(path, "lock: create\n")
    log_api_write(call, "POST", f"/nodes/{call.path_params['node']}/qemu", _config_keys(call.params), [])

    def worker(emit: Callable[[str], None]) -> None:
        conf = _config_keys(call.params)
        allocation = Allocation(vmid, 0)
        try:
            allocate_disks(settings, conf, {}, emit, allocation)
        except DieError as error:
            allocation.free()
            path.unlink()
            raise DieError(f"unable to create VM {vmid} - {error.text}") from None
        _add_macs(vmid, conf)
        if "tags" in conf:
            conf["tags"] = unique_tags(conf["tags"])
        conf.setdefault("boot", _boot_order(conf))
        conf["meta"] = f"creation-qemu={settings.version},ctime={int(time.time())}"
        conf["smbios1"] = f"uuid={uuid.uuid4()}"
        conf["vmgenid"] = str(uuid.uuid4())
        with locked(settings):
            write_atomic(path, write_guest_config(GuestConfig(conf, {}, [], ""), "[PENDING]"))

    return run_task(call, "qmcreate", vmid, worker)


REPLICATION_CFG = "/etc/pve/replication.cfg"


def replication_jobs(text: str) -> list[str]:
    """The job ids of replication.cfg (pve-guest-common ReplicationConfig.pm, a SectionConfig: `local:
    <guest>-<jobnum>` headers); the job's guest is its id's first part."""
    return re.findall(r"^local:\s*(\d+-\d+)\s*$", text, re.MULTILINE)


def destroy_qemu(call: Call) -> Json:
    """API2/Qemu.pm destroy_vm (task `qmdestroy`): the VM must exist, be unprotected and stopped, and
    without `purge` be no HA resource (resources.cfg) and in no replication job (replication.cfg; checked
    before the task and again in it); the task refuses a locked VM without `skiplock` (`VM is locked
    (<lock>)`: QemuServer::destroy_vm's check_lock), frees every volume its config (and pending section)
    names that it owns (not cdroms; its cloud-init drive is freed), with `destroy-unreferenced-disks` also
    every `vm-<vmid>-*` volume of an enabled storage, then removes the config. `skiplock` is root@pam's
    only (`Only root may use this option.`)."""
    settings = call.settings
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock",))

    def early_checks() -> GuestConfig:
        conf = _load_guest(call, "qemu")
        if parse_boolean(conf.main.get("protection", "0")):
            raise DieError(f"can't remove VM {vmid} - protection mode enabled\n")
        if not call.params.get("purge"):
            if f"vm:{vmid}" in ha.parse_resources(_text_or_none(settings.path(ha.RESOURCES_CFG)) or ""):
                raise DieError(
                    f"unable to remove VM {vmid} - used in HA resources and purge parameter not set.\n"
                )
            for job in replication_jobs(_text_or_none(settings.path(REPLICATION_CFG)) or ""):
                if job.split("-")[0] == vmid:
                    raise DieError(
                        f"There is a replication job '{job}' for guest '{vmid}' - Please remove that first.\n"
                    )
        if _is_running(call):
            raise DieError(f"VM {vmid} is running - destroy failed\n")
        return conf

    early_checks()

    def worker(emit: Callable[[str], None]) -> None:
        with locked(settings):
            conf = early_checks()
            if "lock" in conf.main and not call.params.get("skiplock"):
                raise DieError(f"VM is locked ({conf.main['lock']})\n")
            for values in (conf.main, conf.pending):
                for key in [k for k in values if DRIVE_KEY.fullmatch(k) or re.fullmatch(r"unused\d+", k)]:
                    drive = Drive.parse(values[key])
                    if (drive.is_cdrom and not drive.is_cloudinit) or not VOLUME_ID.fullmatch(drive.file):
                        continue
                    volume = parse_volume(settings, drive.file)
                    if volume.vmid == vmid:
                        settings.path(volume.file).unlink(missing_ok=True)
            if call.params.get("destroy-unreferenced-disks"):
                for storage in _storage_state(settings)[0]:
                    if parse_boolean(storage.options.get("disable", "0")) or "images" not in storage.content:
                        continue
                    for image in _list_images(settings, storage, vmid):
                        settings.path(parse_volume(settings, image["volid"]).file).unlink(missing_ok=True)
            if call.params.get("purge"):
                emit(f"purging VM {vmid} from related configurations..")
            _guest_path(call, "qemu").unlink()

    return run_task(call, "qmdestroy", vmid, worker)


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
    if "cipassword" in values:
        values["cipassword"] = "**********"
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


def update_qemu_config(call: Call) -> Json:  # noqa: PLR0912, PLR0915
    settings = call.settings
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock",))
    if "sshkeys" in call.params:
        validate_ssh_keys(call.params["sshkeys"])
    changes, deletes = _config_update(call, _qemu_extra)
    if "hookscript" in changes:
        try:
            check_hookscript(settings, changes["hookscript"])
        except DieError as error:
            raise ParamError({"hookscript": error.text.rstrip("\n")}) from None
    for key in deletes:
        if key in changes:
            raise ParamError({"delete": f"you can't use '-{key}' and -delete {key}' at the same time"})
    check_drives(settings, changes)
    check_qemu_update_perms(call, vmid, changes, deletes)
    with locked(settings):
        conf = _load_guest(call, "qemu")
        if "digest" in call.params and call.params["digest"] != conf.digest:
            raise DieError("checksum mismatch (file change by other user?)\n")
        if "lock" in conf.main and not call.params.get("skiplock"):
            raise DieError(f"VM is locked ({conf.main['lock']})\n")
        check_qemu_device_perms(call, vmid, conf, changes, deletes)
        if "tags" in changes or "tags" in deletes:
            old_tags = conf.pending.get("tags", conf.main.get("tags"))
            assert_tag_permissions(call, vmid, old_tags, changes.get("tags"))
            if "tags" in changes:
                changes["tags"] = unique_tags(changes["tags"])
        log_api_write(call, "PUT", f"/nodes/{call.path_params['node']}/qemu/{vmid}/config", changes, deletes)
        shown = {**changes, **({"delete": ",".join(deletes)} if deletes else {})}
        shown.update({"cipassword": "<hidden>"} if "cipassword" in shown else {})
        sys.stdout.write(f"update VM {vmid}: " + " ".join(f"-{k} {shown[k]}" for k in sorted(shown)) + "\n")
        # As qemu-server's update: disks are allocated (or imported), a new NIC gets a MAC.
        allocation = Allocation(vmid, _next_disk(conf))
        try:
            allocate_disks(settings, changes, {**conf.main, **conf.pending}, _print_line, allocation)
        except DieError:
            allocation.free()
            raise
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
        record = json.loads(_record_path(call).read_text())
        status["pid"] = qemu_running_pid(call.settings, call.path_params["vmid"])
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
    parsed: list[tuple[str, bool, list[list[str]]]] = []
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
        parsed.append((key, pcie, [_alternative_functions(settings, paths) for paths in alternatives]))
    used: set[str] = set()
    devices = []
    for key, pcie, options in parsed:
        functions = _chosen(key, options, used)
        sysfs = settings.sysfs_root / "bus/pci/devices"
        devices.append(
            {
                "hostpci": int(key[7:]),
                "pcie": pcie,
                "functions": functions,
                # for the lab's QEMU check of vfio's clique rule (lab/pve/qemu_check.py)
                "vendors": {f: _attr(sysfs / f, "vendor") for f in functions},
                "classes": {f: _attr(sysfs / f, "class") for f in functions},
            }
        )
    return devices


def _alternative_functions(settings: Settings, paths: list[str]) -> list[str]:
    """PCI.pm parse_hostpci: an alternative (one map line, or `host`) is every function of ALL its
    `;`-separated paths, passed together (the node's map lines are the alternatives)."""
    functions: list[str] = []
    for path in paths:
        found = slot_functions(settings, path)
        if not found:
            raise DieError(f"no PCI device found for '{path}'\n")
        functions += found
    return functions


def _chosen(key: str, options: list[list[str]], used: set[str]) -> list[str]:
    """PCI.pm choose_hostpci_devices: the only alternative, or the first whose functions are all free;
    the chosen functions join `used`."""
    if len(options) == 1:
        taken = next((function for function in options[0] if function in used), None)
        if taken is not None:
            raise DieError(f"device '{taken}' assigned more than once\n")
        chosen = options[0]
    else:
        free = [option for option in options if not used.intersection(option)]
        if not free:
            raise DieError(f"could not find a free device for '{key}'\n")
        chosen = free[0]
    used.update(chosen)
    return chosen


def _numa_nodes(settings: Settings, conf: dict[str, str]) -> None:
    """qemu-server Memory.pm `config`'s custom NUMA checks at start, after the hostpci ones (config_to_command
    order): each numaN needs memory and cpus; hostnodes must exist on the node (its sysfs node directories)
    and need a policy; the nodes' memory must add up to the VM's. Hugepages are not allocated here."""
    if parse_boolean(conf.get("numa", "0")) != 1:
        return
    total = 0.0
    for index in range(8):
        if not conf.get(f"numa{index}"):
            continue
        numa = parse_property_string(P(props=NUMA_FMT), conf[f"numa{index}"])
        if not numa.get("memory") or float(numa["memory"]) == 0:
            raise DieError(f"missing NUMA node{index} memory value\n")
        total += float(numa["memory"])
        if "cpus" not in numa:
            raise DieError(f"missing NUMA node{index} cpus\n")
        if "hostnodes" in numa:
            printed = numa["hostnodes"].replace(";", ",")
            for part in numa["hostnodes"].split(";"):
                first, _, last = part.partition("-")
                for node in range(int(first), int(last or first) + 1):
                    if not (settings.sysfs_root / f"devices/system/node/node{node}").is_dir():
                        raise DieError(f"host NUMA node{node} doesn't exist\n")
            if "policy" not in numa:
                raise DieError(f"you need to define a policy for hostnode {printed}\n")
    memory = float(conf.get("memory", "512").split(",")[0].removeprefix("current="))
    if total and total != memory:
        raise DieError("total memory for NUMA nodes must be equal to vm static memory\n")


def _hypervisor(
    call: Call,
    request: dict[str, Any],
    failure: str = "start failed: ",
    emit: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Ask the lab hypervisor (outside the node) to start/stop a VM's guest or a CT's container host, or
    to run a guest agent command; wait for its answer (requests: lab/pve/hypervisor.py). A refusal fails
    with `<failure><error>`, its `log` lines (QEMU's stderr, as run_command passes it on) to `emit` first."""
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
        if emit is not None:
            for line in answer.get("log", []):
                emit(line)
        raise DieError(f"{failure}{answer.get('error', 'lab hypervisor failed')}\n")
    return answer


def _boot_disk(settings: Settings, conf: dict[str, str]) -> dict[str, str] | None:
    """The disk the VM boots from: the first disk of `boot: order=...` (else scsi0), with its volume's data
    file (a path on the node) for the lab hypervisor; None when there is none."""
    order = re.sub(r"^order=", "", conf.get("boot", "")).split(";")
    keys = [k for k in [*order, "scsi0"] if DRIVE_KEY.fullmatch(k) and k in conf]
    for key in keys:
        drive = Drive.parse(conf[key])
        if drive.is_cdrom or not VOLUME_ID.fullmatch(drive.file):
            continue
        return {"key": key, "volume": drive.file, "path": parse_volume(settings, drive.file).file}
    return None


def _cloud_init(settings: Settings, vmid: str, conf: dict[str, str]) -> dict[str, Any] | None:
    """What Cloudinit.pm generates at start when the VM has a `vm-<vmid>-cloudinit` drive: the user-data
    (the cicustom `user` snippet, else cloudinit_userdata), and what the lab hypervisor needs besides.
    Every cicustom volume is read, as get_custom_cloudinit_files does."""
    if not any(f"vm-{vmid}-cloudinit" in Drive.parse(conf[k]).file for k in _drive_keys(conf)):
        return None
    custom = parse_property_string(P(props=CICUSTOM_FMT), conf.get("cicustom", ""))
    texts = {
        kind: _snippet(settings, custom[kind])
        for kind in ("network", "user", "meta", "vendor")
        if kind in custom
    }
    net0 = re.match(r"(?:[a-z0-9]+|macaddr)=([0-9A-Fa-f:]{17})", conf.get("net0", ""))
    return {
        "user_data": texts.get("user", cloudinit_userdata(conf, vmid)),
        "ipconfig0": conf.get("ipconfig0"),
        "hostname": _hostname_fqdn(conf, vmid)[0],
        "mac": net0.group(1) if net0 else None,
    }


def _snippet(settings: Settings, volid: str) -> str:
    """Cloudinit.pm read_cloudinit_snippets_file."""
    volume = parse_volume(settings, volid)
    if volume.vtype != "snippets":
        raise DieError(f"{volid} is not in the snippets directory\n")
    data = settings.path(volume.file)
    if not data.is_file():
        raise DieError(f"can't find file '{volid}'\n")
    return data.read_bytes()[: 1024 * 1024].decode(errors="replace")


def _hostname_fqdn(conf: dict[str, str], vmid: str) -> tuple[str, str]:
    hostname = conf.get("name", f"VM{vmid}")
    if "." in hostname:
        return hostname.split(".", 1)[0], hostname
    if conf.get("searchdomain"):
        return hostname, f"{hostname}.{conf['searchdomain']}"
    return hostname, hostname


def cloudinit_userdata(conf: dict[str, str], vmid: str) -> str:
    """Cloudinit.pm cloudinit_userdata: the user-data Proxmox generates from name, ciuser, cipassword,
    sshkeys and ciupgrade."""
    hostname, fqdn = _hostname_fqdn(conf, vmid)
    content = f"#cloud-config\nhostname: {hostname}\nmanage_etc_hosts: true\nfqdn: {fqdn}\n"
    username = conf.get("ciuser")
    if username is not None:
        content += f"user: {username}\n"
        if username == "root":
            content += "disable_root: False\n"
    if "cipassword" in conf:
        content += f"password: {conf['cipassword']}\n"
    if "sshkeys" in conf:
        keys = [k for k in urllib.parse.unquote(conf["sshkeys"]).split("\n") if k.strip()]
        content += "ssh_authorized_keys:\n" + "".join(f"  - {k}\n" for k in keys)
    content += "chpasswd:\n  expire: False\n"
    if username != "root":
        content += "users:\n  - default\n"
    if parse_boolean(conf.get("ciupgrade", "1")) != 0:
        content += "package_upgrade: true\n"
    return content


def check_hookscript(settings: Settings, volid: str) -> Path:
    """PVE::GuestHelpers::check_hookscript: the script's path, or DieError with Proxmox's text."""
    volume = parse_volume(settings, volid)
    path = settings.path(volume.file)
    if volume.vtype != "snippets":
        raise DieError(f"'{volid}' is not in the snippets directory\n")
    if not path.is_file():
        raise DieError(f"script '{volid}' does not exist\n")
    if not os.access(path, os.X_OK):
        raise DieError(f"script '{volid}' is not executable\n")
    return path


def exec_hookscript(
    settings: Settings, conf: dict[str, str], vmid: str, phase: str, emit: Callable[[str], None]
) -> None:
    """PVE::GuestHelpers::exec_hookscript with stop_on_error (pre-start): run `<script> <vmid> <phase>`, its
    output to the task log; a failure dies with `hookscript error for <vmid> on <phase>: <error>`."""
    if not conf.get("hookscript"):
        return
    try:
        path = check_hookscript(settings, conf["hookscript"])
        argv = [str(path), vmid, phase]
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        for line in done.stdout.splitlines():
            emit(line)
        if done.returncode != 0:
            raise DieError(f"command '{' '.join(argv)}' failed: exit code {done.returncode}\n")
    except DieError as error:
        raise DieError(f"hookscript error for {vmid} on {phase}: {error.text}\n") from None


def _net0_mac(conf: dict[str, str]) -> str | None:
    """net0's MAC (the NIC an installed system's guest agent reports), None without one."""
    net0 = re.match(r"(?:[a-z0-9]+|macaddr)=([0-9A-Fa-f:]{17})", conf.get("net0", ""))
    return net0.group(1) if net0 else None


def start_qemu(call: Call) -> Json:
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock",))

    def worker(emit: Callable[[str], None]) -> None:
        # qemu-server vm_start: everything below, the pre-start hook included, under lock_config($vmid).
        with vm_config_locked(call.settings, vmid):
            start_locked(emit)

    def start_locked(emit: Callable[[str], None]) -> None:
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
            cloud_init = _cloud_init(call.settings, vmid, staged.main)
            if conf.pending:
                write_atomic(_guest_path(call, "qemu"), write_guest_config(staged, "[PENDING]"))
        # vm_start_nolock runs the pre-start hook here, before it checks the mappings: under the VM's config
        # lock (a hook that changes its VM's config waits for it, as on Proxmox) but outside the stand-in's
        # one write lock (Proxmox's cfs lock of pci.cfg is another), as the hook may write a mapping.
        exec_hookscript(call.settings, staged.main, vmid, "pre-start", emit)
        with locked(call.settings):
            devices = _passthrough(call, staged.main)
            _numa_nodes(call.settings, staged.main)
            disk = _boot_disk(call.settings, staged.main)
        machine = staged.main.get("machine", "pc").split(",")[0]
        request = {
            "action": "start",
            "vmid": int(vmid),
            "name": staged.main.get("name"),
            "machine": machine,
            "bios": staged.main.get("bios", "seabios"),
            "devices": devices,
            "disk": disk,
            "cloud_init": cloud_init,
            "mac": _net0_mac(staged.main),
            "config": staged.main,  # the lab hypervisor builds QEMU's command line from it
        }
        answer = _hypervisor(call, request, emit=emit)
        record = {
            "guest_pid": answer["pid"],  # the lab host's, outside the node
            "started": int(time.time()),
            "machine": "pc-q35-9.2+pve1" if "q35" in machine else "pc-i440fx-9.2+pve1",
        }
        _record_path(call).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(_record_path(call), json.dumps(record))
        _start_placeholder(call, str(staged.main.get("name", f"VM {vmid}")))

    return run_task(call, "qmstart", vmid, worker)


def stop_qemu(call: Call, task_type: str) -> Json:
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock", "keepActive"))

    def worker(_emit: Callable[[str], None]) -> None:
        if not _guest_path(call, "qemu").is_file():
            raise DieError(
                f"unable to find configuration file for VM {vmid} on node '{call.settings.node}'\n"
            )
        if not _is_running(call):
            return
        _hypervisor(call, {"action": "stop", "vmid": int(vmid)})
        _stop_placeholder(call)

    return run_task(call, task_type, vmid, worker)


def resize_qemu(call: Call) -> Json:
    """API2/Qemu.pm `resize_vm` (task `resize`): grows the disk's volume and records `size=`. The stand-in's
    volume size is the `size=` its config records (else the data file's image size)."""
    vmid, key, text = call.path_params["vmid"], call.params["disk"], call.params["size"]
    check_root_params(call, ("skiplock",))

    def worker(_emit: Callable[[str], None]) -> None:
        with locked(call.settings):
            conf = _load_guest(call, "qemu")
            if call.params.get("digest") and call.params["digest"] != conf.digest:
                raise DieError("checksum mismatch (file change by other user?)\n")
            if "lock" in conf.main and not call.params.get("skiplock"):
                raise DieError(f"VM is locked ({conf.main['lock']})\n")
            if key not in conf.main:
                raise DieError(f"disk '{key}' does not exist\n")
            drive = Drive.parse(conf.main[key])
            if drive.is_cdrom:
                raise DieError("you can't resize a cdrom\n")
            volume = parse_volume(call.settings, drive.file)
            rpcenv = call.rpcenv
            rpcenv.check(rpcenv.user, f"/storage/{volume.storage.id}", ("Datastore.AllocateSpace",))
            data = call.settings.path(volume.file)
            size = parse_size(drive.options.get("size", "")) if "size" in drive.options else None
            if size is None and data.is_file():
                size = image_size(data)
            if size is None:
                raise DieError(f"Could not determine current size of volume '{drive.file}'\n")
            grow = text.startswith("+")
            new = parse_size(text.lstrip("+"))
            assert new is not None
            new += size if grow else 0
            if new < size:
                raise DieError("shrinking disks is not supported\n")
            if new == size:
                return
            drive.options["size"] = format_size(new)
            conf.main[key] = drive.print()
            write_atomic(_guest_path(call, "qemu"), write_guest_config(conf, "[PENDING]"))

    return run_task(call, "resize", vmid, worker)


AGENT_DIR = "/var/lib/pvegpu-lab/agent"  # <vmid>.json: the lab hypervisor's network-get-interfaces answer


def _agent_available(call: Call) -> Path:
    """QemuServer/Agent.pm assert_agent_available: configured, VM running, agent answering (the lab
    hypervisor wrote the guest's agent file); returns that file."""
    vmid = call.path_params["vmid"]
    conf = _load_guest(call, "qemu")
    if "agent" not in conf.main:
        raise DieError("No QEMU guest agent configured\n")
    if not _is_running(call):
        raise DieError(f"VM {vmid} is not running\n")
    agent = call.settings.path(f"{AGENT_DIR}/{vmid}.json")
    if not agent.is_file():
        raise DieError("QEMU guest agent is not running\n")
    return agent


def agent_network(call: Call) -> Json:
    return json.loads(_agent_available(call).read_text())


def agent_command(call: Call, command: str, params: dict[str, Any]) -> Any:
    """A guest agent command the lab hypervisor carries out in the guest: its `result`; its `error` fails
    the call as check_agent_error does (`Agent error: <error>`)."""
    _agent_available(call)
    request = {"action": "agent", "vmid": int(call.path_params["vmid"]), "command": command, "params": params}
    return _hypervisor(call, request, "Agent error: ").get("result")


def agent_fsinfo(call: Call) -> Json:
    return {"result": agent_command(call, "get-fsinfo", {})}


def agent_file_read(call: Call) -> Json:
    return agent_command(call, "file-read", dict(call.params))


def agent_file_write(call: Call) -> Json:
    """`content` reaches the hypervisor decoded (with encode=0 the caller sent it base64-encoded)."""
    content = call.params["content"]
    if call.params.get("encode", 1) == 0:
        content = base64.b64decode(content).decode(errors="replace")
    agent_command(call, "file-write", {"file": call.params["file"], "content": content})
    return None


def agent_exec(call: Call) -> Json:
    return agent_command(call, "exec", dict(call.params))


def agent_exec_status(call: Call) -> Json:
    return agent_command(call, "exec-status", {"pid": call.params["pid"]})


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
        unprivileged = bool(parse_boolean(conf.main.get("unprivileged", "0")))
        check_ct_modify_config_perm(call, call.path_params["vmid"], {}, deletes, unprivileged)
        check_ct_modify_config_perm(call, call.path_params["vmid"], changes, [], unprivileged)
        if "tags" in changes or "tags" in deletes:
            assert_tag_permissions(call, call.path_params["vmid"], conf.main.get("tags"), changes.get("tags"))
            if "tags" in changes:
                changes["tags"] = unique_tags(changes["tags"])
        where = f"/nodes/{call.path_params['node']}/lxc/{call.path_params['vmid']}/config"
        log_api_write(call, "PUT", where, changes, deletes)
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
    check_lxc_create_perms(call, vmid, _config_keys(call.params))
    if "tags" in call.params:
        assert_tag_permissions(call, vmid, None, call.params["tags"])
    with locked(settings):
        for kind, folder in (("VM", QEMU_DIR), ("CT", LXC_DIR)):
            if settings.path(f"{folder}/{vmid}.conf").exists():
                raise DieError(f"{kind} {vmid} already exists on node '{settings.node}'\n")
        path = _guest_path(call, "lxc")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, "lock: create\n")
    log_api_write(call, "POST", f"/nodes/{call.path_params['node']}/lxc", _config_keys(call.params), [])

    def worker(emit: Callable[[str], None]) -> None:
        conf = _config_keys(call.params)
        template = conf.pop("ostemplate")
        # Proxmox writes them to the root's authorized_keys, not the config; the lab's container host
        # already has the lab's key.
        conf.pop("ssh-public-keys", None)
        try:
            match = re.fullmatch(r"([a-zA-Z][\w\-.]*):(\d+)", conf.get("rootfs", "local:4"))
            if not match:
                raise DieError(f"storage '{conf.get('rootfs', '').split(':')[0]}' does not exist\n")
            storage_config(settings, match.group(1))
            for key, value in conf.items():
                if re.fullmatch(r"dev\d+", key):
                    _check_device(settings, value)
        except DieError as error:
            path.unlink()
            raise DieError(f"unable to create CT {vmid} - {error.text}") from None
        conf["rootfs"] = f"{match.group(1)}:vm-{vmid}-disk-0,size={match.group(2)}G"
        conf.setdefault("unprivileged", "1")
        if "tags" in conf:
            conf["tags"] = unique_tags(conf["tags"])
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
    check_root_params(call, ("skiplock",))
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


def stop_lxc(call: Call, task_type: str = "vzstop") -> Json:
    """`vzstop` (§6.4), and pve-container API2/LXC/Status.pm `vm_shutdown` (`vzshutdown`): `CT <vmid> not
    running` before the fork. The stand-in's container has no init to ask, so a shutdown ends it at once."""
    vmid = call.path_params["vmid"]
    if task_type == "vzstop":
        check_root_params(call, ("skiplock",))
    _load_guest(call, "lxc")
    if not _lxc_running_path(call).is_file():
        raise DieError(f"CT {vmid} not running\n")

    def worker(_emit: Callable[[str], None]) -> None:
        _hypervisor(call, {"action": "stop", "type": "lxc", "vmid": int(vmid)})
        _lxc_running_path(call).unlink(missing_ok=True)

    return run_task(call, task_type, vmid, worker)


# --- endpoints: the node's guest lists and HA (what a reboot would stop) -------------------------------


def _guest_ids(settings: Settings, folder: str) -> list[int]:
    directory = settings.path(folder)
    names = sorted(directory.glob("*.conf")) if directory.is_dir() else []
    return [int(p.stem) for p in names if re.fullmatch(r"[1-9][0-9]{2,8}", p.stem)]


def list_qemu(call: Call) -> Json:
    """qemu-server API2/Qemu.pm `vmlist` (PVE::QemuServer::vmstatus without `full`): only the VMs the user
    has VM.Audit on; `status` from the pidfile check (`qemu_running_pid`)."""
    rpcenv, result = call.rpcenv, []
    for vmid in _guest_ids(call.settings, QEMU_DIR):
        if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Audit",), noerr=True):
            continue
        values = parse_guest_config(
            read_bytes(call.settings.path(f"{QEMU_DIR}/{vmid}.conf")), "[PENDING]"
        ).main
        pid = qemu_running_pid(call.settings, str(vmid))
        memory = re.match(r"(?:current=)?(\d+)", values.get("memory", "512"))
        entry: dict[str, Any] = {
            "vmid": vmid,
            "status": "running" if pid is not None else "stopped",
            "name": values.get("name", f"VM {vmid}"),
            "cpus": int(values.get("cores", "1")) * int(values.get("sockets", "1")),
            "maxmem": int(memory.group(1) if memory else 512) * 1024 * 1024,
            **_IDLE_COUNTERS,
        }
        if pid is not None:
            entry["pid"] = pid
        entry.update({key: values[key] for key in ("lock", "tags") if key in values})
        result.append(entry)
    return result


def list_lxc(call: Call) -> Json:
    """pve-container API2/LXC.pm `vmlist` (PVE::LXC::vmstatus): only the CTs the user has VM.Audit on;
    `name` the hostname (`CT<vmid>` without one), `type` lxc."""
    rpcenv, result = call.rpcenv, []
    for vmid in _guest_ids(call.settings, LXC_DIR):
        if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Audit",), noerr=True):
            continue
        values = parse_guest_config(
            read_bytes(call.settings.path(f"{LXC_DIR}/{vmid}.conf")), "[pve:pending]"
        ).main
        running = call.settings.path(f"/run/lxc/{vmid}.running").is_file()
        entry: dict[str, Any] = {
            "vmid": vmid,
            "type": "lxc",
            "status": "running" if running else "stopped",
            "name": re.sub(r"\s", "", values.get("hostname", f"CT{vmid}")),
            "cpus": int(values.get("cores", "1")),
            "maxmem": int(values.get("memory", "512")) * 1024 * 1024,
            "maxswap": int(values.get("swap", "0")) * 1024 * 1024,
            "swap": 0,
            **_IDLE_COUNTERS,
            "maxdisk": 4 * 1024 * 1024 * 1024,  # vmstatus' default for a stopped CT without a rootfs size
        }
        entry.update({key: values[key] for key in ("lock", "tags") if key in values})
        result.append(entry)
    return result


def _text_or_none(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def list_ha_resources(call: Call) -> Json:
    return ha.resources_index(_text_or_none(call.settings.path(ha.RESOURCES_CFG)) or "")


def get_ha_status(call: Call) -> Json:
    settings = call.settings
    guests = {vmid: settings.node for folder in (QEMU_DIR, LXC_DIR) for vmid in _guest_ids(settings, folder)}
    return ha.status_current(
        settings.node,
        _text_or_none(settings.path(ha.RESOURCES_CFG)) or "",
        _text_or_none(settings.path(ha.MANAGER_STATUS)),
        guests,
    )


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


# --- permissions (qemu-server API2/Qemu.pm, pve-container LXC.pm, pve-storage Storage.pm) ------------------
# Under pvesh the caller is root@pam and every check passes; under the pveproxy stand-in it is an API token.

ROOT_ONLY_OPTION = "Only root may use this option."
API_WRITES_LOG = "/var/log/pvegpu-lab/api-writes.log"  # the lab's record: who set which config keys
# API2/Qemu.pm: the option lists of $check_vm_modify_config_perm; every other key is root@pam's only.
QEMU_CPU_OPTIONS = {"cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus"}
QEMU_MEMORY_OPTIONS = {"memory", "balloon", "shares", "allow-ksm"}
QEMU_HWTYPE_OPTIONS = {
    *("acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga"),
    *("watchdog", "audio0", "rng0"),
}
QEMU_GENERAL_OPTIONS = {
    *("agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime"),
    *("migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf"),
    "template",
}
QEMU_DISK_OPTIONS = {"boot", "bootdisk", "vmstatestorage"}
QEMU_CLOUDINIT_OPTIONS = {
    *("cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys"),
}
# API2/Qemu.pm $vm_config_perm_list, API2/LXC/Config.pm's: the update endpoints' clauses (any of them).
QEMU_CONFIG_PRIVS = (
    *("VM.Config.Disk", "VM.Config.CDROM", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network"),
    *("VM.Config.HWType", "VM.Config.Options", "VM.Config.Cloudinit"),
)
LXC_CONFIG_PRIVS = (
    *("VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options"),
)


def check_root_params(call: Call, names: tuple[str, ...]) -> None:
    """`skiplock`, `keepActive`, ...: `<name>: Only root may use this option.` (400) for anyone else."""
    if call.rpcenv.is_root:
        return
    for name in names:
        if call.params.get(name):
            raise ParamError({name: ROOT_ONLY_OPTION})


def check_vm_modify_config_perm(  # noqa: PLR0912 (one branch per option list, as upstream)
    rpcenv: access.RpcEnv, vmid: str, keys: list[str]
) -> None:
    """API2/Qemu.pm $check_vm_modify_config_perm: the privilege each key needs on /vms/<vmid>; drives,
    serialN, usbN, hostpciN, virtiofsN and unusedN are checked elsewhere (by value); any key outside the
    lists (args, hookscript, hugepages, affinity, lock, ...) dies `only root can set '<key>' config`."""
    if rpcenv.is_root:
        return
    user = rpcenv.user
    for key in keys:
        if key in DRIVE_NAMES or key in ("cdrom", "tags"):
            continue
        if re.fullmatch(r"(?:unused|serial|usb|hostpci|virtiofs)\d+", key):
            continue
        if key in QEMU_CPU_OPTIONS or re.fullmatch(r"numa\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.CPU",))
        elif key in QEMU_MEMORY_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Memory",))
        elif key in QEMU_HWTYPE_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.HWType",))
        elif key in QEMU_GENERAL_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Options",))
            if key == "startup":
                rpcenv.check_full(user, "/", ("Sys.Modify",))
        elif key == "freeze":
            rpcenv.check_vm_perm(user, vmid, ("VM.PowerMgmt",))
        elif key in QEMU_DISK_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Disk",))
        elif re.fullmatch(r"net\d+", key) or key == "running-nets-host-mtu":
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Network",))
        elif key in QEMU_CLOUDINIT_OPTIONS or re.fullmatch(r"ipconfig\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Cloudinit", "VM.Config.Network"), any_of=True)
        elif key == "vmstate":
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Disk", "VM.PowerMgmt"))
        else:
            raise DieError(f"only root can set '{key}' config\n")


# --- tags (pve-guest-common GuestHelpers.pm; datacenter.cfg `user-tag-access`, `registered-tags`) --------
DATACENTER_CFG = "/etc/pve/datacenter.cfg"


def split_tags(text: str | None) -> list[str]:
    """PVE::Tools::split_list: a tag list split on `;`, `,`, spaces (and NUL)."""
    return [tag for tag in re.split(r"[;,\s\0]+", text or "") if tag]


def unique_tags(text: str) -> str:
    """GuestHelpers.pm get_unique_tags with the default tag-style: lowercased, deduplicated, sorted, `;`."""
    return ";".join(sorted({tag.lower() for tag in split_tags(text)}))


def _datacenter(settings: Settings) -> dict[str, str]:
    path = settings.path(DATACENTER_CFG)
    text = path.read_text() if path.exists() else ""
    found = (re.fullmatch(r"([a-z][a-z0-9-]*):\s*(.*?)\s*", line) for line in text.splitlines())
    return {match.group(1): match.group(2) for match in found if match}


def _guest_tags(settings: Settings, rpcenv: access.RpcEnv, privileged: bool) -> set[str]:
    """get_allowed_tags' `existing` set: the tags of every guest the user may audit (all, privileged)."""
    tags: set[str] = set()
    for folder in (QEMU_DIR, LXC_DIR):
        directory = settings.path(folder)
        for conf in sorted(directory.glob("*.conf")) if directory.exists() else []:
            if not privileged and not rpcenv.check_vm_perm(rpcenv.user, conf.stem, ("VM.Audit",), noerr=True):
                continue
            values = parse_guest_config(conf.read_bytes(), "[PENDING]").main
            tags.update(split_tags(values.get("tags")))
    return tags


def assert_tag_permissions(call: Call, vmid: str, old: str | None, new: str | None) -> None:
    """GuestHelpers.pm assert_tag_permissions: VM.Config.Options on the guest; each tag added or removed
    must be allowed by datacenter `user-tag-access` (`user-allow` free (default) | existing | list | none,
    `user-allow-list`) and not a `registered-tags` one, unless the user has Sys.Modify on `/`:
    `Permission check failed (/, Sys.Modify for modifying tag '<tag>')`."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    rpcenv.check_vm_perm(rpcenv.user, vmid, ("VM.Config.Options",))
    if rpcenv.check(rpcenv.user, "/", ("Sys.Modify",), noerr=True):
        return
    config = _datacenter(call.settings)
    access_opts = dict(
        part.split("=", 1) for part in config.get("user-tag-access", "").split(",") if "=" in part
    )
    user_allow = access_opts.get("user-allow", "free")
    privileged_tags = set(split_tags(config.get("registered-tags")))
    allowed = set(split_tags(access_opts.get("user-allow-list"))) if user_allow != "none" else set()
    if user_allow in ("free", "existing"):
        allowed |= _guest_tags(call.settings, rpcenv, privileged=False)
    allowed -= privileged_tags
    before, after = split_tags(old), split_tags(new)
    for tag in sorted(set(before) | set(after)):
        if before.count(tag) == after.count(tag):
            continue
        if (tag not in allowed and user_allow != "free") or tag in privileged_tags:
            raise access.PermissionDenied(f"/, Sys.Modify for modifying tag '{tag}'")


def check_hostpci_perm(rpcenv: access.RpcEnv, vmid: str, key: str, value: str) -> None:
    """API2/Qemu.pm check_hostpci_perm: `host=` is root@pam's only; `mapping=` needs Mapping.Use on
    /mapping/pci/<id> and VM.Config.HWType; `romfile` is root@pam's only (400)."""
    if rpcenv.is_root:
        return
    device = parse_property_string(P(props=HOSTPCI_FMT, default_key="host"), value)
    if "host" in device:
        raise DieError(f"only root can set '{key}' config for non-mapped devices\n")
    if "mapping" in device:
        rpcenv.check_full(rpcenv.user, f"/mapping/pci/{device['mapping']}", ("Mapping.Use",))
        rpcenv.check_vm_perm(rpcenv.user, vmid, ("VM.Config.HWType",))
    else:
        raise DieError("either 'host' or 'mapping' must be set.\n")
    if "romfile" in device:
        raise ParamError({key: "only root@pam can set 'romfile' option"})


def _check_serial_perm(rpcenv: access.RpcEnv, vmid: str, key: str, value: str, verb: str) -> None:
    """$check_vm_create_serial_perm and update_vm's serialN branch: a `socket` needs VM.Config.HWType."""
    if rpcenv.is_root:
        return
    if value != "socket":
        raise DieError(f"only root can {verb} '{key}' config for real devices\n")
    rpcenv.check_vm_perm(rpcenv.user, vmid, ("VM.Config.HWType",))


def check_bridge_access(rpcenv: access.RpcEnv, conf: dict[str, str]) -> None:
    """QemuServer.pm check_bridge_access / GuestHelpers.pm check_vnet_access (no SDN: zone
    `localnetwork`): SDN.Use on /sdn/zones/localnetwork/<bridge>[/<tag>]."""
    if rpcenv.is_root:
        return
    for key in sorted(k for k in conf if re.fullmatch(r"net\d+", k)):
        net = dict(part.partition("=")[::2] for part in conf[key].split(",") if "=" in part)
        if "bridge" not in net:
            continue
        path = f"/sdn/zones/localnetwork/{net['bridge']}"
        rpcenv.check(rpcenv.user, f"{path}/{net['tag']}" if net.get("tag") else path, ("SDN.Use",))


def check_volume_access(call: Call, volid: str, vmid: str | None, wanted: str | None = None) -> None:
    """PVE::Storage::check_volume_access: Datastore.Allocate on the storage allows all; an iso, vztmpl or
    import volume needs Datastore.AllocateSpace or Datastore.Audit; one's own disk nothing; another VM's
    disk Datastore.Audit + VM.Config.Disk on its owner; a path is root@pam's only."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    user = rpcenv.user
    if not VOLUME_ID.fullmatch(volid):
        raise DieError("Only root can pass arbitrary filesystem paths.")
    volume = parse_volume(call.settings, volid)
    if wanted is not None and volume.vtype != wanted and (wanted != "rootdir" or volume.vtype != "images"):
        raise DieError(f"unable to use volume {volid} - content type needs to be '{wanted}'\n")
    sid = volume.storage.id
    if rpcenv.check(user, f"/storage/{sid}", ("Datastore.Allocate",), noerr=True):
        return
    if volume.vtype in ("iso", "vztmpl", "import"):
        rpcenv.check_any(user, f"/storage/{sid}", ("Datastore.AllocateSpace", "Datastore.Audit"))
    elif volume.vmid is not None and vmid is not None and volume.vmid == vmid:
        pass
    elif volume.vtype == "backup" and volume.vmid:
        rpcenv.check(user, f"/storage/{sid}", ("Datastore.AllocateSpace",))
        rpcenv.check(user, f"/vms/{volume.vmid}", ("VM.Backup",))
    elif volume.vtype in ("images", "rootdir") and volume.vmid:
        rpcenv.check(user, f"/storage/{sid}", ("Datastore.Audit",))
        rpcenv.check(user, f"/vms/{volume.vmid}", ("VM.Config.Disk",))
    else:
        raise DieError(f"missing privileges to access {volid}\n")


def check_storage_perms(call: Call, vmid: str, changes: dict[str, str]) -> None:
    """API2/Qemu.pm $check_storage_access: a new disk needs Datastore.AllocateSpace on its storage, an
    existing volume check_volume_access, an `import-from` source too (or VM.Clone on its VM); `cdrom`
    (the host's drive) Sys.Console on /."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    for key in _drive_keys(changes):
        drive = Drive.parse(changes[key])
        volume = VOLUME_ID.fullmatch(drive.file)
        new = NEW_DISK.fullmatch(drive.file)
        if drive.file in ("", "none", "cloudinit") or (volume and volume.group(2) == "cloudinit"):
            pass
        elif drive.is_cdrom and drive.file == "cdrom":
            rpcenv.check(rpcenv.user, "/", ("Sys.Console",))
        elif not drive.is_cdrom and new:
            rpcenv.check(rpcenv.user, f"/storage/{new.group(2)}", ("Datastore.AllocateSpace",))
        else:
            check_volume_access(call, drive.file, vmid)
        source = drive.options.get("import-from")
        if source is not None:
            owner = parse_volume(call.settings, source).vmid if VOLUME_ID.fullmatch(source) else None
            if owner:
                rpcenv.check(rpcenv.user, f"/vms/{owner}", ("VM.Clone",))
            else:
                check_volume_access(call, source, vmid)


def check_qemu_create_perms(call: Call, vmid: str, conf: dict[str, str]) -> None:
    """API2/Qemu.pm create_vm's checks, in its order: VM.Allocate on /vms/<vmid> (a bare `Permission
    check failed` without), storage access, each key's privilege, serialN, hostpciN, the bridges."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Allocate",), noerr=True):
        raise access.PermissionDenied()
    check_storage_perms(call, vmid, conf)
    check_vm_modify_config_perm(rpcenv, vmid, sorted(conf))
    for key in sorted(k for k in conf if re.fullmatch(r"serial\d+", k)):
        _check_serial_perm(rpcenv, vmid, key, conf[key], "set")
    for key in sorted(k for k in conf if re.fullmatch(r"hostpci\d+", k)):
        check_hostpci_perm(rpcenv, vmid, key, conf[key])
    check_bridge_access(rpcenv, conf)


def check_qemu_update_perms(call: Call, vmid: str, changes: dict[str, str], deletes: list[str]) -> None:
    """API2/Qemu.pm update_vm before the config is loaded: the keys deleted, then the keys set
    ($check_vm_modify_config_perm: deleting a root-only key is root's too), storage, bridges."""
    check_vm_modify_config_perm(call.rpcenv, vmid, deletes)
    check_vm_modify_config_perm(call.rpcenv, vmid, sorted(changes))
    check_storage_perms(call, vmid, changes)
    check_bridge_access(call.rpcenv, changes)


def check_qemu_device_perms(
    call: Call, vmid: str, conf: GuestConfig, changes: dict[str, str], deletes: list[str]
) -> None:
    """update_vm's value-dependent checks on the loaded config: a hostpciN deleted (its value), replaced
    (old and new value) or set (check_hostpci_perm); serialN as `socket` only."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    current = {**conf.main, **{k: v for k, v in conf.pending.items() if k != "delete"}}
    for key in deletes:
        if re.fullmatch(r"hostpci\d+", key) and key in current:
            check_hostpci_perm(rpcenv, vmid, key, current[key])
        elif re.fullmatch(r"serial\d+", key) and key in current:
            _check_serial_perm(rpcenv, vmid, key, current[key], "delete")
    for key in sorted(changes):
        if re.fullmatch(r"hostpci\d+", key):
            if conf.main.get(key):
                check_hostpci_perm(rpcenv, vmid, key, conf.main[key])
            check_hostpci_perm(rpcenv, vmid, key, changes[key])
        elif re.fullmatch(r"serial\d+", key):
            old = conf.main.get(key)
            _check_serial_perm(rpcenv, vmid, key, changes[key] if old in (None, "socket") else old, "modify")


def check_ct_modify_config_perm(  # noqa: PLR0912 (one branch per key kind, as upstream)
    call: Call, vmid: str, changes: dict[str, str], deletes: list[str], unprivileged: bool
) -> None:
    """pve-container LXC.pm check_ct_modify_config_perm (keys set, then deleted): devN, hookscript and a
    privileged CT's features are root@pam's only (`Permission check failed (<why>)`); a rootfs/mpN a
    volume with storage access; every other key its VM.Config.* privilege."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    user = rpcenv.user
    for key, deleting in [*((k, False) for k in sorted(changes)), *((k, True) for k in deletes)]:
        if key in ("cores", "cpuunits", "cpulimit"):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.CPU",))
        elif key == "rootfs" or re.fullmatch(r"mp\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Disk",))
            if not deleting:
                volid = changes[key].split(",")[0].removeprefix("volume=")
                if new := re.fullmatch(r"([^:\s]+):(\d+(\.\d+)?)", volid):
                    rpcenv.check(user, f"/storage/{new.group(1)}", ("Datastore.AllocateSpace",))
                else:
                    check_volume_access(call, volid, vmid, "rootdir")
        elif key in ("memory", "swap"):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Memory",))
        elif re.fullmatch(r"net\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Network",))
            if not deleting:
                check_bridge_access(rpcenv, {key: changes[key]})
        elif re.fullmatch(r"dev\d+", key):
            raise access.PermissionDenied("configuring device passthrough is only allowed for root@pam")
        elif key in ("nameserver", "searchdomain", "hostname"):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Network",))
        elif key == "features":
            if not unprivileged:
                raise access.PermissionDenied(
                    "changing feature flags for privileged container is only allowed for root@pam"
                )
            features = {f.partition("=")[0] for f in changes.get(key, "").split(",") if f}
            if features - {"nesting"}:
                raise access.PermissionDenied(
                    "changing feature flags (except nesting) is only allowed for root@pam"
                )
            rpcenv.check_vm_perm(user, vmid, ("VM.Allocate",))
        elif key == "hookscript":
            raise access.PermissionDenied("changing the hookscript is only allowed for root@pam")
        elif key != "tags":
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Options",))


def check_lxc_create_perms(call: Call, vmid: str, conf: dict[str, str]) -> None:
    """API2/LXC.pm create_vm's checks, in its order: Sys.Modify on / for a privileged CT, VM.Allocate on
    /vms/<vmid> (a bare `Permission check failed` without), each key, then the template's access."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    unprivileged = bool(parse_boolean(conf.get("unprivileged", "1")))
    if not unprivileged:
        rpcenv.check(rpcenv.user, "/", ("Sys.Modify",))
    if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Allocate",), noerr=True):
        raise access.PermissionDenied()
    keys = {k: v for k, v in conf.items() if k not in ("ostemplate", "ssh-public-keys")}
    check_ct_modify_config_perm(call, vmid, keys, [], unprivileged)
    check_volume_access(call, conf["ostemplate"], vmid, "vztmpl")


def log_api_write(call: Call, method: str, path: str, changes: dict[str, str], deletes: list[str]) -> None:
    """One line per accepted guest config write in the lab's API_WRITES_LOG: `<user> <METHOD> <path>
    <keys>` (keys set, then `-<key>` per key deleted), so that tests can tell which identity set what.
    The record is the lab's, not Proxmox's: a write it cannot make (a full disk, a file size limit) changes
    nothing of the call."""
    keys = ",".join([*sorted(changes), *(f"-{key}" for key in deletes)])
    log = call.settings.path(API_WRITES_LOG)
    with contextlib.suppress(OSError):
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as handle:
            handle.write(f"{call.rpcenv.user} {method} {path} {keys}\n")


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

# QemuServer/Drive.pm valid_drive_names (this order).
DRIVE_NAMES = (
    *(f"ide{i}" for i in range(4)),
    *(f"scsi{i}" for i in range(31)),
    *(f"virtio{i}" for i in range(16)),
    *(f"sata{i}" for i in range(6)),
    "efidisk0",
    "tpmstate0",
)
AGENT_PATH = r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/agent"
AGENT_ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", f"{AGENT_PATH}/network-get-interfaces", Endpoint("GET", {}, agent_network)),
    ("get", f"{AGENT_PATH}/get-fsinfo", Endpoint("GET", {}, agent_fsinfo)),
    (
        "get",
        f"{AGENT_PATH}/file-read",
        Endpoint(
            "GET",
            {
                "file": P(optional=False),
                "count": P(type="integer", minimum=1, maximum=16 * 1024 * 1024),
                "decode": BOOL,
                "offset": P(type="integer", minimum=0),
            },
            agent_file_read,
        ),
    ),
    (
        "create",
        f"{AGENT_PATH}/file-write",
        Endpoint(
            "POST",
            {"file": P(optional=False), "content": P(optional=False, max_length=60 * 1024), "encode": BOOL},
            agent_file_write,
            True,
        ),
    ),
    (
        "create",
        f"{AGENT_PATH}/exec",
        Endpoint(
            "POST",
            {"command": P(type="array", optional=False, items=P()), "input-data": P(max_length=64 * 1024)},
            agent_exec,
        ),
    ),
    (
        "get",
        f"{AGENT_PATH}/exec-status",
        Endpoint("GET", {"pid": P(type="integer", optional=False)}, agent_exec_status),
    ),
]

ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"version", Endpoint("GET", {}, get_version)),
    (
        "get",
        r"access/permissions",
        Endpoint("GET", {"userid": P(pattern=USERID_OR_TOKEN), "path": P()}, get_access_permissions),
    ),
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
    ("get", r"nodes/(?P<node>[^/]+)/qemu", Endpoint("GET", {"full": BOOL}, list_qemu)),
    ("get", r"nodes/(?P<node>[^/]+)/lxc", Endpoint("GET", {}, list_lxc)),
    (
        "get",
        r"cluster/ha/resources",
        Endpoint("GET", {"type": P(enum=("vm", "ct"))}, list_ha_resources),
    ),
    ("get", r"cluster/ha/status/current", Endpoint("GET", {}, get_ha_status)),
    (
        "delete",
        r"nodes/(?P<node>[^/]+)/storage/(?P<storage>[^/]+)/content/(?P<volume>.+)",
        Endpoint("DELETE", {"delay": P(type="integer", minimum=1, maximum=30)}, delete_volume),
    ),
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
        "delete",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)",
        Endpoint(
            "DELETE",
            {"skiplock": BOOL, "purge": BOOL, "destroy-unreferenced-disks": BOOL},
            destroy_qemu,
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
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/shutdown",
        Endpoint(
            "POST",
            {"timeout": P(type="integer", minimum=0), "forceStop": BOOL},
            lambda call: stop_lxc(call, "vzshutdown"),
        ),
    ),
    (
        "set",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/resize",
        Endpoint(
            "PUT",
            {
                "disk": P(optional=False, enum=DRIVE_NAMES),
                "size": P(optional=False, pattern=r"\+?\d+(\.\d+)?[KMGT]?"),
                "digest": P(max_length=40),
                "skiplock": BOOL,
            },
            resize_qemu,
        ),
    ),
    *AGENT_ROUTES,
    ("get", r"storage", Endpoint("GET", {"type": P(enum=STORAGE_TYPES)}, list_storages)),
    ("get", r"storage/(?P<storage>[^/]+)", Endpoint("GET", {}, get_storage)),
    (
        "set",
        r"storage/(?P<storage>[^/]+)",
        Endpoint(
            "PUT",
            {
                "content": P(verify=verify_content_list, list_format=True),
                "delete": P(list_format=True),
                "digest": P(max_length=64),
                "disable": BOOL,
            },
            update_storage,
        ),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/storage/(?P<storage>[^/]+)/content",
        Endpoint(
            "GET",
            {"content": P(verify=verify_content), "vmid": P(type="integer", verify=verify_vmid, minimum=100)},
            list_storage_content,
        ),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/storage/(?P<storage>[^/]+)/download-url",
        Endpoint(
            "POST",
            {
                "url": P(optional=False, pattern=r"https?://.*"),
                "content": P(optional=False, verify=verify_content, enum=("iso", "vztmpl", "import")),
                "filename": P(optional=False, max_length=255),
                "checksum": P(requires="checksum-algorithm"),
                "checksum-algorithm": P(
                    enum=("md5", "sha1", "sha224", "sha256", "sha384", "sha512"), requires="checksum"
                ),
                "compression": P(enum=("gz", "lzo", "zst", "bz2")),
                "verify-certificates": BOOL,
            },
            download_url,
        ),
    ),
    ("get", r"nodes/(?P<node>[^/]+)/tasks/(?P<upid>[^/]+)/status", Endpoint("GET", {}, get_task_status)),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/tasks/(?P<upid>[^/]+)/log",
        Endpoint(
            "GET",
            {"start": P(type="integer", minimum=0), "limit": P(type="integer", minimum=0), "download": BOOL},
            get_task_log,
        ),
    ),
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
# Each endpoint's `permissions` clause (checked before its parameters, as pveproxy does), by method and path:
# qemu-server API2/Qemu.pm and Qemu/Agent.pm, pve-container API2/LXC.pm, LXC/Config.pm, LXC/Status.pm,
# pve-manager API2/Cluster/Mapping/PCI.pm and API2/Tasks.pm, pve-storage API2/Storage/Config.pm, Content.pm,
# Status.pm, pve-access-control API2/AccessControl.pm. `ALL_USERS`: any user, the checks are inside.
_VMS = "/vms/{vmid}"
_AGENT = "/nodes/{node}/qemu/{vmid}/agent"
_MAPPING_ANY = tuple(
    access.Perm("/mapping/pci/{id}", (priv,)) for priv in ("Mapping.Use", "Mapping.Modify", "Mapping.Audit")
)
PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/version"): access.ALL_USERS,
    ("GET", "/access/permissions"): access.ALL_USERS,
    ("GET", "/cluster/mapping/pci"): access.ALL_USERS,
    ("POST", "/cluster/mapping/pci"): access.Perm("/mapping/pci", ("Mapping.Modify",)),
    ("GET", "/cluster/mapping/pci/{id}"): access.Or(_MAPPING_ANY),
    ("PUT", "/cluster/mapping/pci/{id}"): access.Perm("/mapping/pci/{id}", ("Mapping.Modify",)),
    ("DELETE", "/cluster/mapping/pci/{id}"): access.Perm("/mapping/pci", ("Mapping.Modify",)),
    ("GET", "/nodes/{node}/qemu"): access.ALL_USERS,  # filtered by VM.Audit inside
    ("GET", "/nodes/{node}/lxc"): access.ALL_USERS,
    ("GET", "/cluster/ha/resources"): access.Perm("/", ("Sys.Audit",)),
    ("GET", "/cluster/ha/status/current"): access.Perm("/", ("Sys.Audit",)),
    ("POST", "/nodes/{node}/qemu"): access.ALL_USERS,
    ("DELETE", "/nodes/{node}/qemu/{vmid}"): access.Perm(_VMS, ("VM.Allocate",)),
    ("GET", "/nodes/{node}/qemu/{vmid}/config"): access.Perm(_VMS, ("VM.Audit",)),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config"): access.Perm(_VMS, QEMU_CONFIG_PRIVS, any=True),
    ("GET", "/nodes/{node}/qemu/{vmid}/status/current"): access.Perm(_VMS, ("VM.Audit",)),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/start"): access.Perm(_VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/stop"): access.Perm(_VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/shutdown"): access.Perm(_VMS, ("VM.PowerMgmt",)),
    ("PUT", "/nodes/{node}/qemu/{vmid}/resize"): access.Perm(_VMS, ("VM.Config.Disk",)),
    ("GET", f"{_AGENT}/network-get-interfaces"): access.Perm(
        _VMS, ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("GET", f"{_AGENT}/get-fsinfo"): access.Perm(
        _VMS, ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("GET", f"{_AGENT}/file-read"): access.Perm(
        _VMS, ("VM.GuestAgent.FileRead", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("POST", f"{_AGENT}/file-write"): access.Perm(
        _VMS, ("VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("POST", f"{_AGENT}/exec"): access.Perm(_VMS, ("VM.GuestAgent.Unrestricted",)),
    ("GET", f"{_AGENT}/exec-status"): access.Perm(_VMS, ("VM.GuestAgent.Unrestricted",)),
    ("POST", "/nodes/{node}/lxc"): access.ALL_USERS,
    ("GET", "/nodes/{node}/lxc/{vmid}/config"): access.Perm(_VMS, ("VM.Audit",)),
    ("PUT", "/nodes/{node}/lxc/{vmid}/config"): access.Perm(_VMS, LXC_CONFIG_PRIVS, any=True),
    ("GET", "/nodes/{node}/lxc/{vmid}/status/current"): access.Perm(_VMS, ("VM.Audit",)),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/start"): access.Perm(_VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/stop"): access.Perm(_VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/shutdown"): access.Perm(_VMS, ("VM.PowerMgmt",)),
    ("GET", "/storage"): access.ALL_USERS,
    ("GET", "/storage/{storage}"): access.Perm("/storage/{storage}", ("Datastore.Allocate",)),
    ("PUT", "/storage/{storage}"): access.Perm("/storage", ("Datastore.Allocate",)),
    ("GET", "/nodes/{node}/storage/{storage}/content"): access.Perm(
        "/storage/{storage}", ("Datastore.Audit", "Datastore.AllocateSpace"), any=True
    ),
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"): access.ALL_USERS,  # checked inside
    ("POST", "/nodes/{node}/storage/{storage}/download-url"): access.And(
        (
            access.Perm("/storage/{storage}", ("Datastore.AllocateTemplate",)),
            access.Or(
                (
                    access.Perm("/", ("Sys.Audit", "Sys.Modify")),
                    access.Perm("/nodes/{node}", ("Sys.AccessNetwork",)),
                )
            ),
        )
    ),
    ("GET", "/nodes/{node}/tasks"): access.ALL_USERS,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): access.ALL_USERS,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): access.ALL_USERS,
}
PATH_PARAMS: dict[str, P] = {
    "node": NODE_P,
    "storage": P(optional=False, verify=verify_storage_id),
    "vmid": VMID_P,
    "id": P(optional=False, verify=verify_configid),
    "upid": P(optional=False),
    "volume": P(optional=False),
}


def find_route(cmd: str, path: str) -> tuple[Endpoint, dict[str, str]] | None:
    clean = path.strip("/")
    for route_cmd, pattern, endpoint in ROUTES:
        match = re.fullmatch(pattern, clean)
        if route_cmd == cmd and match:
            return endpoint, match.groupdict()
    return None


def route_template(pattern: str) -> str:
    """A route's path as Proxmox writes it: `/nodes/{node}/qemu/{vmid}/config`."""
    return "/" + re.sub(r"\(\?P<(\w+)>(?:\[\^/\]\+|\.\+)\)", r"{\1}", pattern)  # `.+`: a volid's slashes


def endpoint_permissions(cmd: str, path: str) -> access.Permissions:
    """The `permissions` clause of the endpoint `cmd path` routes to (None: none known, root@pam only)."""
    clean = path.strip("/")
    for route_cmd, pattern, endpoint in ROUTES:
        if route_cmd == cmd and re.fullmatch(pattern, clean):
            return PERMISSIONS.get((endpoint.method, route_template(pattern)))
    return None


def call_api(settings: Settings, rpcenv: access.RpcEnv, cmd: str, path: str, raw: dict[str, Any]) -> Json:
    """One API call by `rpcenv.user` to an existing route (`find_route`), `raw` its options as strings
    (lists for arrays): the endpoint's permissions clause (before the parameters, in pveproxy's order),
    the parameters verified (JSONSchema), then its handler. Raises access.PermissionDenied, ParamError
    or DieError."""
    found = find_route(cmd, path)
    assert found is not None
    endpoint, path_values = found
    rpcenv.check_api2_permissions(endpoint_permissions(cmd, path), {**path_values, **raw})
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
    check_requires("", endpoint.params, raw, errors)
    if errors:
        raise ParamError(errors)
    if "node" in path_values:
        _local_node(settings, path_values["node"])
    return endpoint.handler(Call(settings, dict(path_values), params, rpcenv=rpcenv))


def fail(text: str, code: int = 255) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.write(text)
    sys.stderr.flush()
    raise SystemExit(code)


def main(argv: list[str]) -> int:
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
    endpoint = found[0]
    try:
        raw, output = parse_options(argv[2:], endpoint)
    except OptionError as error:
        fail(
            "".join(f"{line}\n" for line in error.lines)
            + "400 unable to parse option\n"
            + usage(cmd, endpoint)
            + "\n"
        )
    try:
        result = call_api(load_settings(), access.RpcEnv(), cmd, path, raw)
    except ParamError as error:
        lines = "".join(f"{k}: {v}\n" for k, v in sorted(error.errors.items()))
        fail(f"400 Parameter verification failed.\n{lines}{usage(cmd, endpoint)}\n")
    except (DieError, access.PermissionDenied) as error:
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
