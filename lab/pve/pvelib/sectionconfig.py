"""The section-config files the stand-in reads besides storage.cfg, on pvegpu's one reader
(pvegpu/facts/section_config.py): the hardware and directory mappings /etc/pve/mapping/pci.cfg
(PVE::Mapping::PCI) and /etc/pve/mapping/directory.cfg (PVE::Mapping::Dir), replication.cfg and jobs.cfg."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import section_config
from .formats import CONFIGID, DIR_MAP_FMT, MAP_FMT
from .jsonschema import P, check_value, parse_boolean
from .pmxcfs import read_bytes, sha1

if TYPE_CHECKING:
    from .settings import Settings


@dataclass
class Section:
    id: str
    map: list[str]
    options: dict[str, Any]  # description (str), the kind's booleans (0/1)


@dataclass(frozen=True)
class MappingKind:
    """One pve-guest-common PVE::Mapping::<type> file: a SectionConfig of bare-id sections (its own
    parse_section_header), a required `map` array of `map_fmt` entries, an optional `description` and the
    kind's boolean options; written as write_config does: `map` lines first (the required option), then the
    optional ones sorted."""

    type: str  # the section type parse_config gives each section (`pci`, `dir`)
    cfg: str
    map_fmt: dict[str, P]
    booleans: tuple[str, ...] = ()

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(sorted(("description", *self.booleans)))


PCI_MAPPING = MappingKind("pci", "/etc/pve/mapping/pci.cfg", MAP_FMT, ("live-migration-capable", "mdev"))


DIR_MAPPING = MappingKind("dir", "/etc/pve/mapping/directory.cfg", DIR_MAP_FMT)  # Mapping/Dir.pm $FILENAME


def parse_mapping_cfg(text: str, kind: MappingKind = PCI_MAPPING) -> list[Section]:
    """Sections in file order (pvegpu's section-config reader; a repeated key keeps its first value, every
    `map` line is kept); invalid ids, bad values and sections without a valid map are dropped."""
    sections: list[Section] = []
    option = functools.partial(_mapping_option, kind)
    for item in section_config.read_sections(text, section_config.ID_HEADER):
        if isinstance(item, section_config.Section) and CONFIGID.fullmatch(item.header[1]):
            options, _ = section_config.properties(item, option, arrays=("map",))
            entries = options.pop("map", [])
            if entries:
                sections.append(Section(item.header[1], entries, options))
    return sections


def _mapping_option(kind: MappingKind, key: str, value: str | None) -> Any:
    """A mapping file's value as the stand-in keeps it (description a string, the booleans 0/1, map checked
    against its format), or SectionValueError."""
    if key == "map" and value is not None:
        errors: dict[str, str] = {}
        check_value("map", P(props=kind.map_fmt), value, errors)
        if not errors:
            return value
    elif key in kind.booleans:
        if value is None or value in ("0", "1"):
            return 1 if value is None else int(value)
    elif key == "description" and value is not None:
        return value
    raise section_config.SectionValueError(key)


def write_mapping_cfg(sections: list[Section], kind: MappingKind = PCI_MAPPING) -> str:
    out = []
    for s in sections:
        out.append(f"{s.id}\n")
        out.extend(f"\tmap {m}\n" for m in s.map)
        out.extend(f"\t{k} {s.options[k]}\n" for k in kind.options if k in s.options)
        out.append("\n")
    return "".join(out)


def mapping_state(settings: Settings, kind: MappingKind = PCI_MAPPING) -> tuple[list[Section], str]:
    data = read_bytes(settings.path(kind.cfg))
    return parse_mapping_cfg(data.decode(), kind), sha1(data)


def map_entry(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if part)


REPLICATION_CFG = "/etc/pve/replication.cfg"


JOBS_CFG = "/etc/pve/jobs.cfg"


# The typed options of replication.cfg (pve-guest-common ReplicationConfig.pm) and of jobs.cfg's vzdump jobs
# (pve-manager PVE/VZDump/JobBase.pm over VZDump::Common's json_config_properties); the others are strings.
_REPLICATION_TYPES = {"disable": "boolean", "rate": "number"}


VZDUMP_TYPES = {
    **dict.fromkeys(("all", "enabled", "repeat-missed", "remove", "stdexcludes", "quiet"), "boolean"),
    **dict.fromkeys(("stop", "stdout", "protected"), "boolean"),
    **dict.fromkeys(("bwlimit", "ionice", "lockwait", "maxfiles", "pigz", "stopwait", "zstd"), "integer"),
    **dict.fromkeys(("fleecing", "prune-backups", "performance"), "object"),  # Backup.pm returns objects
}


def parse_section_cfg(text: str, kinds: dict[str, dict[str, str]]) -> list[tuple[str, str, dict[str, Any]]]:
    """pve-common SectionConfig parse_config (pvegpu's section-config reader): `(type, id, options)` per
    section of a type in `kinds` (type -> option -> `boolean`, `integer`, `number` or `object`, a property
    string; others strings), in file order; a section of another type is skipped, a repeated key keeps its
    first value, a value of the wrong type drops the key (each a warning upstream)."""
    sections: list[tuple[str, str, dict[str, Any]]] = []
    for item in section_config.read_sections(text):
        kind = item.header[1].lower() if isinstance(item, section_config.Section) else ""
        if isinstance(item, section_config.Section) and kind in kinds:
            options, _ = section_config.properties(item, functools.partial(_typed_option, kinds[kind]))
            sections.append((kind, item.header[2], options))
    return sections


def _typed_option(types: dict[str, str], key: str, value: str | None) -> Any:
    typed = _section_value(types.get(key), value or "")
    if typed is None:
        raise section_config.SectionValueError(key)
    return typed


def _section_value(kind: str | None, text: str) -> Any:
    if kind == "boolean":
        return parse_boolean(text)
    if kind == "integer":
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else None
    if kind == "number":
        return float(text) if re.fullmatch(r"[+-]?(?:\d+\.?\d*|\.\d+)", text) else None
    if kind == "object":
        parts = [part.split("=", 1) for part in text.split(",") if part]
        return {k: int(v) if v.isdigit() else v for k, v in (p for p in parts if len(p) == 2)}
    return text


def parse_replication(text: str) -> dict[str, dict[str, Any]]:
    """replication.cfg (pve-guest-common ReplicationConfig.pm, a SectionConfig of `local: <guest>-<jobnum>`
    sections): id -> the job as parse_config leaves it, `type`, integer `guest` and `jobnum` added; an id
    whose guest is below 100 is skipped (parse_replication_job_id)."""
    jobs: dict[str, dict[str, Any]] = {}
    for kind, job_id, options in parse_section_cfg(text, {"local": _REPLICATION_TYPES}):
        found = re.fullmatch(r"(\d+)-(\d+)", job_id)
        if found is None or int(found[1]) < 100:
            continue
        guest, jobnum = int(found[1]), int(found[2])
        jobs[f"{guest}-{jobnum}"] = {**options, "type": kind, "guest": guest, "jobnum": jobnum}
    return jobs


def replication_jobs(text: str) -> list[str]:
    """The job ids of replication.cfg; the job's guest is its id's first part."""
    return list(parse_replication(text))
