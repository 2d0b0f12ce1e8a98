"""/etc/pve/mapping/pci.cfg: a faithful pure parser and Proxmox's canonical writer.

The grammar and behaviours are PVE::SectionConfig's with PVE::Mapping::PCI's header
(shared/knowledge/proxmox-pci-mapping.md §1-2), read by the shared reader (facts/section_config.py):

- A header is a bare, non-indented mapping id (`^(\\S+)\\s*$`); an id that is not a `pve-configid` skips
  the whole section with the warning `(skip section 'Bad.Id'): invalid configuration ID 'Bad.Id'`.
- Property lines are indented (`^\\s+(\\S+)(\\s+(.*\\S))?\\s*$`); `#` comment lines are skipped anywhere;
  an empty line ends the section. Any other line inside a section is ignored with a warning (so a header
  that follows a section without a blank line is NOT a new section: its properties join the open one).
- `map` may repeat; repeating another key is an error (`duplicate attribute`), the first value is kept.
  Each `map` value is checked by `pvegpu.models.pve.parse_map_entry` (the entry format lives with MapEntry).
- Booleans (`mdev`, `live-migration-capable`) are exactly `0` or `1`; a key with no value is `1`.
- A bad value is recorded in `errors` and dropped; a section left without any `map` fails
  (`missing value for required option 'map'`) and is listed in `failed` (Proxmox keeps it as undef).

Warnings carry SectionConfig's prefix `file <filename> line <n>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pvegpu.facts import section_config
from pvegpu.models.pve import CONFIG_ID, DESCRIPTION_MAX, MapEntryError, PciMapping, parse_map_entry

FILENAME = "mapping/pci.cfg"


BOOLEAN_KEYS = ("live-migration-capable", "mdev")
SECTION_KEYS = ("map", "description", *BOOLEAN_KEYS)


@dataclass(frozen=True)
class CfgError:
    """One value error SectionConfig records in `$cfg->{errors}` (the value is dropped, parsing goes on)."""

    context: str
    section: str
    key: str
    err: str


@dataclass(frozen=True)
class PciCfg:
    """A parsed pci.cfg: the valid mappings in file order, the ids of sections that failed as a whole,
    the recorded value errors, and the warnings Proxmox prints while parsing."""

    mappings: tuple[PciMapping, ...]
    failed: tuple[str, ...]
    errors: tuple[CfgError, ...]
    warnings: tuple[str, ...]

    def get(self, mapping_id: str) -> PciMapping | None:
        return next((m for m in self.mappings if m.id == mapping_id), None)


def parse_pci_cfg(text: str, filename: str = FILENAME) -> PciCfg:
    """Parse pci.cfg text as Proxmox does (see the module docstring); never raises on bad content."""
    mappings: list[PciMapping] = []
    failed: list[tuple[int, str]] = []
    warnings: list[str] = []
    errors: list[CfgError] = []
    for item in section_config.read_sections(text, section_config.ID_HEADER):
        if isinstance(item, section_config.Stray):
            warnings.append(f"file {filename} line {item.number} - ignore config line: {item.line}")
            continue
        mapping_id = item.header[1]
        if not CONFIG_ID.fullmatch(mapping_id):
            warnings.append(
                f"file {filename} line {item.number} (skip section '{mapping_id}'): "
                f"invalid configuration ID '{mapping_id}'"
            )
            continue
        values, problems = section_config.properties(item, _checked, arrays=("map",))
        for problem in problems:
            context = f"file {filename} line {problem.entry.number}"
            if problem.err is None:
                warnings.append(
                    f"{context} (section '{mapping_id}') - ignore config line: {problem.entry.line}"
                )
                continue
            key = problem.entry.key or ""
            errors.append(CfgError(context, mapping_id, key, problem.err))
            if problem.err != section_config.DUPLICATE:
                warnings.append(
                    f"{context} (section '{mapping_id}') - unable to parse value of '{key}': {problem.err}"
                )
        if values.get("map"):
            mappings.append(_mapping(mapping_id, values))
        else:
            failed.append((item.number, mapping_id))
    for number, mapping_id in failed:
        warnings.append(
            f"file {filename} line {number} (skip section '{mapping_id}'): "
            "missing value for required option 'map'"
        )
    return PciCfg(tuple(mappings), tuple(i for _, i in failed), tuple(errors), tuple(warnings))


def _checked(key: str, value: str | None) -> str:
    """SectionConfig's check_value for pci.cfg's keys: the value to keep, or SectionValueError."""
    if key not in SECTION_KEYS:
        raise section_config.SectionValueError(f"unexpected property '{key}'")
    if value is None:
        if key not in BOOLEAN_KEYS:
            raise section_config.SectionValueError("property is missing and it is not optional")
        value = "1"
    problem = _section_value_problem(key, value)
    if problem is not None:
        raise section_config.SectionValueError(problem)
    return value


def _section_value_problem(key: str, value: str) -> str | None:
    if key in BOOLEAN_KEYS:
        return None if value in ("0", "1") else f"type check ('boolean') failed - got '{value}'"
    if key == "description":
        return (
            None if len(value) <= DESCRIPTION_MAX else f"value may only be {DESCRIPTION_MAX} characters long"
        )
    try:
        parse_map_entry(value)
    except MapEntryError as problem:
        return f"invalid format - {problem}"
    return None


def _mapping(mapping_id: str, values: dict[str, Any]) -> PciMapping:
    def boolean(key: str) -> bool | None:
        value = values.get(key)
        return None if value is None else value == "1"

    return PciMapping(
        id=mapping_id,
        map=tuple(values["map"]),
        description=values.get("description"),
        mdev=boolean("mdev"),
        live_migration_capable=boolean("live-migration-capable"),
    )


def render_pci_cfg(mappings: Sequence[PciMapping]) -> str:
    """pci.cfg text as SectionConfig::write_config writes it: sections in the given order, each the id line,
    then `map` (required) and the optional keys sorted, TAB-indented, booleans as 0/1, map entries verbatim,
    and an empty line after every section."""
    out: list[str] = []
    for mapping in mappings:
        out.append(f"{mapping.id}\n")
        out.extend(f"\tmap {entry}\n" for entry in mapping.map)
        optional = {
            "description": mapping.description,
            "live-migration-capable": _bit(mapping.live_migration_capable),
            "mdev": _bit(mapping.mdev),
        }
        out.extend(f"\t{key} {value}\n" for key, value in optional.items() if value is not None)
        out.append("\n")
    return "".join(out)


def _bit(value: bool | None) -> str | None:
    return None if value is None else str(int(value))


def replace_map_lines(text: str, replacements: Mapping[tuple[str, str], str]) -> str:
    """`text` with, for each `(section id, old entry): new entry`, that section's `map` line holding `old`
    rewritten to hold `new`; every other byte (comments, indentation, other sections, order) as it was.

    Sections are found with the parser's grammar (a header opens one, an empty line ends it). Raises
    ValueError naming the first replacement whose line is not there exactly once.
    """
    lines = text.split("\n")
    found: dict[tuple[str, str], int] = dict.fromkeys(replacements, 0)
    section: str | None = None
    for number, line in enumerate(lines):
        if section_config.COMMENT.match(line):
            continue
        if line == "":
            section = None
            continue
        if section is None:
            header = section_config.ID_HEADER.fullmatch(line)
            section = header[1] if header else None
            continue
        match = section_config.PROPERTY.fullmatch(line)
        if match is None or match[1] != "map" or (section, match[3]) not in replacements:
            continue
        found[section, match[3]] += 1
        lines[number] = line[: match.start(3)] + replacements[section, match[3]] + line[match.end(3) :]
    for (section_id, old), count in found.items():
        if count != 1:
            raise ValueError(f"section {section_id} has {count} map lines {old!r}, not one")
    return "\n".join(lines)
