"""qemu-server's drives: drive strings, disk allocation and import (`<storage>:<size>`, `import-from`), the
cloud-init drive, MAC addresses, the boot order and SSH keys."""

from __future__ import annotations

import base64
import hashlib
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DieError, ParamError
from .formats import VOLUME_ID
from .storage import Storage, allocate_volume, format_size, image_size, parse_volume, storage_config

if TYPE_CHECKING:
    from .guest_config import GuestConfig
    from .settings import Settings

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


def drive_keys(conf: dict[str, str]) -> list[str]:
    return sorted(k for k in conf if DRIVE_KEY.fullmatch(k))


def check_drives(settings: Settings, changes: dict[str, str]) -> None:
    """API2/Qemu.pm $check_drive_param, then $check_storage_access, before any lock or task (400s on the
    drive's key, a missing storage as a plain error)."""
    for key in drive_keys(changes):
        drive = Drive.parse(changes[key])
        if "import-from" in drive.options:
            new = NEW_DISK.fullmatch(drive.file)
            if not new or float(new.group(3)) != 0:
                raise ParamError({key: IMPORT_SYNTAX})
            for required in ("efitype", "pre-enrolled-keys") if key == "efidisk0" else ():
                if required not in drive.options:
                    raise ParamError({key: f"need to specify '{required}' when using 'import-from'"})
    for key in drive_keys(changes):
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


def next_disk_index(conf: GuestConfig) -> int:
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
    for key in drive_keys(conf):
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
    other = next((k for k in drive_keys(conf) if k != key and Drive.parse(conf[k]).is_cloudinit), None)
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


def guest_mac(vmid: str, index: str) -> str:
    digest = hashlib.sha1(f"{vmid}:{index}".encode()).hexdigest().upper()
    return f"BC:24:11:{digest[0:2]}:{digest[2:4]}:{digest[4:6]}"


def add_macs(vmid: str, conf: dict[str, str]) -> None:
    for key in [k for k in conf if re.fullmatch(r"net\d+", k)]:
        head, sep, rest = conf[key].partition(",")
        if "=" not in head and re.fullmatch(r"[a-z0-9]+", head):
            conf[key] = f"{head}={guest_mac(vmid, key)}{sep}{rest}"


def boot_order(conf: dict[str, str]) -> str:
    def first(pattern: str, cdrom: bool) -> list[str]:
        keys = sorted((k for k in conf if re.fullmatch(pattern, k)), key=lambda k: (re.sub(r"\d", "", k), k))
        return [k for k in keys if ("media=cdrom" in conf[k]) == cdrom][:1]

    disks = first(r"(ide|sata|scsi|virtio)\d+", False)
    cdroms = first(r"(ide|sata|scsi)\d+", True)
    nets = sorted((k for k in conf if re.fullmatch(r"net\d+", k)), key=lambda k: int(k[3:]))[:1]
    return "order=" + ";".join(disks + cdroms + nets)
