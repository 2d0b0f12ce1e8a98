"""/etc/pve/mapping/pci.cfg: a faithful pure parser and Proxmox's canonical writer.

The grammar and behaviours are PVE::SectionConfig's with PVE::Mapping::PCI's header
(shared/knowledge/proxmox-pci-mapping.md §1-2):

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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.pve import CONFIG_ID, DESCRIPTION_MAX, MapEntryError, PciMapping, parse_map_entry

FILENAME = "mapping/pci.cfg"

_HEADER = re.compile(r"(\S+)\s*")
_PROPERTY = re.compile(r"\s+(\S+)(\s+(.*\S))?\s*")
_COMMENT = re.compile(r"\s*#")

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


class _Section:
    def __init__(self, mapping_id: str, line: int) -> None:
        self.id = mapping_id
        self.line = line
        self.map: list[str] = []
        self.values: dict[str, str] = {}


def parse_pci_cfg(text: str, filename: str = FILENAME) -> PciCfg:
    """Parse pci.cfg text as Proxmox does (see the module docstring); never raises on bad content."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # Perl's split drops trailing empty fields; inner blank lines stay
    position = 0

    def next_line() -> tuple[int, str] | None:
        nonlocal position
        while position < len(lines):
            position += 1
            if not _COMMENT.match(lines[position - 1]):
                return position, lines[position - 1]
        return None

    sections: list[_Section] = []
    warnings: list[str] = []
    errors: list[CfgError] = []
    while position < len(lines):
        got = next_line()
        if got is None or got[1] == "":
            continue
        number, line = got
        header = _HEADER.fullmatch(line)
        if header is None:
            warnings.append(f"file {filename} line {number} - ignore config line: {line}")
            continue
        section: _Section | None = _Section(header[1], number)
        if not CONFIG_ID.fullmatch(header[1]):
            warnings.append(
                f"file {filename} line {number} (skip section '{header[1]}'): "
                f"invalid configuration ID '{header[1]}'"
            )
            section = None
        while (got := next_line()) is not None and got[1] != "":
            if section is not None:
                _property(section, got, filename, warnings, errors)
        if section is not None:
            sections.append(section)
    mappings, failed = [], []
    for section in sections:
        if section.map:
            mappings.append(_mapping(section))
        else:
            failed.append(section.id)
            warnings.append(
                f"file {filename} line {section.line} (skip section '{section.id}'): "
                "missing value for required option 'map'"
            )
    return PciCfg(tuple(mappings), tuple(failed), tuple(errors), tuple(warnings))


def _property(
    section: _Section, got: tuple[int, str], filename: str, warnings: list[str], errors: list[CfgError]
) -> None:
    number, line = got
    context = f"file {filename} line {number}"
    match = _PROPERTY.fullmatch(line)
    if match is None:
        warnings.append(f"{context} (section '{section.id}') - ignore config line: {line}")
        return
    key, value = match[1], match[3]

    def error(err: str) -> None:
        warnings.append(f"{context} (section '{section.id}') - unable to parse value of '{key}': {err}")
        errors.append(CfgError(context, section.id, key, err))

    if key not in SECTION_KEYS:
        error(f"unexpected property '{key}'")
        return
    if key != "map" and key in section.values:
        errors.append(CfgError(context, section.id, key, "duplicate attribute"))
        return
    if value is None:
        if key not in BOOLEAN_KEYS:
            error("property is missing and it is not optional")
            return
        value = "1"
    problem = _section_value_problem(key, value)
    if problem is not None:
        error(problem)
    elif key == "map":
        section.map.append(value)
    else:
        section.values[key] = value


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


def _mapping(section: _Section) -> PciMapping:
    def boolean(key: str) -> bool | None:
        value = section.values.get(key)
        return None if value is None else value == "1"

    return PciMapping(
        id=section.id,
        map=tuple(section.map),
        description=section.values.get("description"),
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
        if _COMMENT.match(line):
            continue
        if line == "":
            section = None
            continue
        if section is None:
            header = _HEADER.fullmatch(line)
            section = header[1] if header else None
            continue
        match = _PROPERTY.fullmatch(line)
        if match is None or match[1] != "map" or (section, match[3]) not in replacements:
            continue
        found[section, match[3]] += 1
        lines[number] = line[: match.start(3)] + replacements[section, match[3]] + line[match.end(3) :]
    for (section_id, old), count in found.items():
        if count != 1:
            raise ValueError(f"section {section_id} has {count} map lines {old!r}, not one")
    return "\n".join(lines)
