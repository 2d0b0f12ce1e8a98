"""Proxmox VE objects pvegpu reads and writes: cluster PCI mappings and their `map` entries, API results.

Plain frozen data, and the pure parser of a `map` entry (`parse_map_entry`), which the planners, the
operations and the pci.cfg parser share. The formats are Proxmox's (shared/knowledge/proxmox-pci-mapping.md):

- a mapping id is a `pve-configid`: `^[a-z][a-z0-9_-]+$`, case-insensitive;
- a `map` entry is a comma-separated `key=value` property string with the keys `node`, `path`, `id`
  (required) and `subsystem-id`, `iommugroup`, `description` (optional). Proxmox stores entries verbatim;
  `MapEntry.text` is the canonical form Proxmox's own writer prints (required keys sorted, then optional
  keys sorted): `id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:204b`.

Where the knowledge file does not give Proxmox's exact wording of a value error (the inner texts of a
malformed `map` string), `MapEntryError` names the key and the rule it breaks in JSONSchema's words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

CONFIG_ID = re.compile(r"[a-z][a-z0-9_-]+", re.IGNORECASE)
NODE_NAME = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?")
# Domain required, lowercase hex only, function optional; `;` separates the paths of one device set.
_PCI_PATH = r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
PCI_PATH = re.compile(rf"(?:{_PCI_PATH};)*{_PCI_PATH}")
PCI_ID = re.compile(r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}")
INTEGER = re.compile(r"[+-]?\d+")
_GROUP_DIGITS = 18
DESCRIPTION_MAX = 4096
MAP_REQUIRED = ("id", "node", "path")
MAP_OPTIONAL = ("description", "iommugroup", "subsystem-id")
_PAIR = re.compile(r"([^=]+)=(.+)", re.DOTALL)


@dataclass(frozen=True)
class MapEntry:
    """One `map` line of a PCI mapping: which device on which node the mapping stands for.

    `iommugroup` and `subsystem-id` are what Proxmox's live check compares with the node's sysfs; an entry
    lacking one the hardware reports fails that check, so pvegpu always writes both.
    """

    node: str
    path: str
    id: str
    subsystem_id: str | None = None
    iommugroup: int | None = None
    description: str | None = None

    @property
    def text(self) -> str:
        """The property string in Proxmox's canonical key order."""
        optional = {
            "description": self.description,
            "iommugroup": None if self.iommugroup is None else str(self.iommugroup),
            "subsystem-id": self.subsystem_id,
        }
        parts = [f"id={self.id}", f"node={self.node}", f"path={self.path}"]
        parts.extend(f"{key}={value}" for key, value in optional.items() if value is not None)
        return ",".join(parts)

    @property
    def paths(self) -> tuple[str, ...]:
        """The `;`-separated paths of `path`: ONE alternative, every path's functions passed together
        (qemu-server PCI.pm `parse_hostpci`; pve-guest-common Mapping/PCI.pm `assert_valid` checks each, the
        IOMMU group on the first only). A node's alternatives are its map lines."""
        return tuple(self.path.split(";"))


class MapEntryError(ValueError):
    """A `map` property string Proxmox would refuse; the message is the reason."""


def parse_map_entry(text: str) -> MapEntry:
    """Parse one `map` property string the way JSONSchema::parse_property_string + check_object do.

    Raises MapEntryError: `value without key, but schema does not define a default key`,
    `invalid key in comma-separated list property: <k>`, `duplicate key in comma-separated list
    property: <k>`, or `<k>: <rule>` for a missing or malformed value (several joined by `; `).
    """
    values: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        pair = _PAIR.fullmatch(part)
        if pair is None:
            raise MapEntryError("value without key, but schema does not define a default key")
        key, value = pair[1], pair[2]
        if key not in MAP_REQUIRED + MAP_OPTIONAL:
            raise MapEntryError(f"invalid key in comma-separated list property: {key}")
        if key in values:
            raise MapEntryError(f"duplicate key in comma-separated list property: {key}")
        values[key] = value
    problems = [
        f"{key}: property is missing and it is not optional" for key in MAP_REQUIRED if key not in values
    ]
    problems.extend(
        f"{key}: {why}" for key, value in values.items() if (why := _map_value_problem(key, value))
    )
    if problems:
        raise MapEntryError("; ".join(problems))
    group = values.get("iommugroup")
    return MapEntry(
        node=values["node"],
        path=values["path"],
        id=values["id"],
        subsystem_id=values.get("subsystem-id"),
        iommugroup=None if group is None else int(group),
        description=values.get("description"),
    )


def _map_value_problem(key: str, value: str) -> str | None:
    if key == "node" and not NODE_NAME.fullmatch(value):
        return "value does not look like a valid node name"
    if key == "path" and not PCI_PATH.fullmatch(value):
        return "value does not match the regex pattern"
    if key in ("id", "subsystem-id") and not PCI_ID.fullmatch(value):
        return "value does not match the regex pattern"
    if key == "iommugroup":
        return _group_problem(value)
    if key == "description" and len(value) > DESCRIPTION_MAX:
        return f"value may only be {DESCRIPTION_MAX} characters long"
    return None


def _group_problem(value: str) -> str | None:
    if not INTEGER.fullmatch(value):
        return f"type check ('integer') failed - got '{value}'"
    if len(value) > _GROUP_DIGITS:
        # Proxmox's check takes any length; Python will not read one this long (and no group is that big).
        return f"{len(value)} characters: an IOMMU group number has at most {_GROUP_DIGITS}"
    return None


@dataclass(frozen=True)
class PciMapping:
    """One section of /etc/pve/mapping/pci.cfg (= one entry of `GET /cluster/mapping/pci`).

    `map` holds the entries' property strings verbatim, as Proxmox stores them. Booleans are None when
    the key is absent (Proxmox then treats them as 0).
    """

    id: str
    map: tuple[str, ...]
    description: str | None = None
    mdev: bool | None = None
    live_migration_capable: bool | None = None


class Severity(StrEnum):
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class MappingCheck:
    """One result of Proxmox's `check-node` check of a mapping, message verbatim (errors end in `\\n`)."""

    severity: Severity
    message: str


@dataclass(frozen=True)
class MappingState:
    """A mapping as the API lists it: the section, the digest of the whole pci.cfg, and, when the list was
    asked with `check-node`, the checks for that node (empty = valid there; None = not checked)."""

    mapping: PciMapping
    digest: str
    checks: tuple[MappingCheck, ...] | None = None


@dataclass(frozen=True)
class TaskStatus:
    """`GET /nodes/{node}/tasks/{upid}/status`: `exitstatus` is None while running, `OK` on success."""

    upid: str
    status: str
    exitstatus: str | None

    @property
    def ok(self) -> bool:
        """Ended and succeeded: `OK`, or `WARNINGS: N` (the task logged warnings; pve-common
        src/PVE/UPID.pm `status_is_error`)."""
        return self.status == "stopped" and not status_is_error(self.exitstatus)


_WARNINGS = re.compile(r"WARNINGS: \d+")


def status_is_error(exitstatus: str | None) -> bool:
    """pve-common src/PVE/UPID.pm `status_is_error`: anything but `OK` and `WARNINGS: <N>` is a failure
    (`unexpected status` too); None (no exit status yet) is not a success either."""
    return exitstatus is None or not (exitstatus == "OK" or _WARNINGS.fullmatch(exitstatus) is not None)


@dataclass(frozen=True)
class GuestConfig:
    """A VM or container config as the API returns it: keys and values (ints/strings as Proxmox types them)
    plus the `digest` of the config file, for an update that must not overwrite a concurrent edit."""

    values: dict[str, object]
    digest: str


@dataclass(frozen=True)
class VmStatus:
    """`GET …/qemu/{vmid}/status/current`: `status` is `running` or `stopped`; `qmpstatus` may add detail."""

    vmid: int
    status: str
    qmpstatus: str | None
    name: str | None


QEMU_RUN_DIR = "/var/run/qemu-server"  # qemu-server Helpers.pm $var_run_tmpdir: <vmid>.pid


@dataclass(frozen=True)
class QemuProcess:
    """What a node shows of a VM's QEMU process, as qemu-server's `check_running` reads it: the first line of
    /var/run/qemu-server/<vmid>.pid (None: no such file), and when that is a PID, its /proc/<pid>/cmdline
    (None: no such process) and the state letter of its /proc/<pid>/stat (`S`, `Z`, ...; None: none)."""

    pidfile: bytes | None
    cmdline: bytes | None
    state: str | None


@dataclass(frozen=True)
class StorageConfig:
    """A storage's `GET /storage/{id}`: its content types, its directory (dir-like storages) and digest."""

    storage: str
    content: tuple[str, ...]
    path: str | None
    digest: str
    type: str = ""  # the plugin (`dir`, `nfs`, ...); "" where the answer had none
    shared: bool = False  # `shared 1`: the same contents on every node (set for network types too)


@dataclass(frozen=True)
class StorageVolume:
    """One volume of a storage's content listing (`GET /nodes/{node}/storage/{storage}/content`): its
    `volid`, the guest that owns it (`vmid`, None for none) and its creation time (`ctime`, Unix seconds of
    the node's clock; None where the storage plugin reports none)."""

    volid: str
    vmid: int | None
    ctime: int | None


@dataclass(frozen=True)
class ReplicationJob:
    """A storage replication job (`GET /cluster/replication`, pve-manager API2/ReplicationConfig.pm over
    pve-guest-common ReplicationConfig.pm): its `id` (`<guest>-<jobnum>`) and the `guest` it replicates."""

    id: str
    guest: int


@dataclass(frozen=True)
class BackupJob:
    """A vzdump backup job (`GET /cluster/backup`, pve-manager API2/Backup.pm): its `id`, what selects its
    guests (PVE::VZDump get_included_guests: `pool`, else the `vmids` list, else `all` but `exclude`), the
    `node` it is limited to (None: every node) and whether it is `enabled`."""

    id: str
    vmids: tuple[int, ...] = ()
    all: bool = False
    exclude: tuple[int, ...] = ()
    pool: str | None = None
    node: str | None = None
    enabled: bool = True


@dataclass(frozen=True)
class GuestInterface:
    """An interface the QEMU guest agent reports: name, MAC and IPv4 addresses (`address/prefix`)."""

    name: str
    mac: str
    ipv4: tuple[str, ...]
