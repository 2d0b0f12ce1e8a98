"""pve-storage: storage.cfg (read with pvegpu's section-config reader, written as SectionConfig writes it),
volume ids, their data files and new volumes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import section_config
from .errors import DieError
from .formats import CONTENT_TYPES, VOLUME_ID
from .pmxcfs import sha1

if TYPE_CHECKING:
    from .settings import Settings

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
    """Sections in file order (pvegpu's section-config reader; a repeated key keeps its first value, a key
    without a value is `1`); Plugin::parse_config adds a `local` dir storage when none is defined."""
    storages: list[Storage] = []
    for item in section_config.read_sections(text):
        if isinstance(item, section_config.Section):
            options, _ = section_config.properties(item, _storage_option)
            storages.append(Storage(item.header[2], item.header[1].lower(), options))
    if not any(s.id == "local" and s.type == "dir" for s in storages):
        storages = [s for s in storages if s.id != "local"]
        content = "backup,images,iso,rootdir,snippets,vztmpl"
        local = {"path": "/var/lib/vz", "content": content, "prune-backups": "keep-all=1"}
        storages.insert(0, Storage("local", "dir", local))
    return storages


def _storage_option(_key: str, value: str | None) -> str:
    return "1" if value is None else value


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


def storage_state(settings: Settings) -> tuple[list[Storage], str]:
    path = settings.path(STORAGE_CFG)
    data = path.read_bytes() if path.is_file() else DEFAULT_STORAGE_CFG.encode()
    return parse_storage_cfg(data.decode()), sha1(data)


def storage_config(settings: Settings, storage_id: str) -> Storage:
    """PVE::Storage::storage_config: the section, or `storage '<id>' does not exist`."""
    for storage in storage_state(settings)[0]:
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
