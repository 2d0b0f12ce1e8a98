"""Proxmox's section-config format, read as pve-common's SectionConfig::parse_config reads it: a pure,
standard-library-only reader shared by pvegpu's readers of /etc/pve (facts/pci_cfg.py, facts/pve_files.py)
and the lab's Proxmox stand-in (lab/pve/, which ships this file to the node beside its package).

The grammar (pve-common src/PVE/SectionConfig.pm, `parse_config`):

- lines matching `^\\s*#` are skipped everywhere; outside a section an empty line is skipped;
- a header is a non-indented line the file's header pattern matches (`parse_section_header`: `type: id` for
  most files, a bare id for pci.cfg); any other line outside a section is ignored (`ignore config line`);
- inside a section, an empty line ends it; a property is an indented `key value` line
  (`^\\s+(\\S+)(\\s+(.*\\S))?\\s*$`, a key without a value has value None); any other line (a header
  without a blank line before it, a line of spaces) is ignored and the section goes on;
- a repeated key that is not an array is an error, `duplicate attribute`, and keeps its FIRST value; an array
  key (pci.cfg's `map`) keeps every value. A value the file's check refuses is an error and is not stored, so
  a later line of the same key may still set it.

Not modelled: Perl's falsy `"0"` line (it would end a section like an empty line).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

TYPED_HEADER = re.compile(r"(\S+):\s*(\S+)\s*")  # SectionConfig::parse_section_header: `type: id`
ID_HEADER = re.compile(r"(\S+)\s*")  # PVE::Mapping::PCI's parse_section_header: the bare id
PROPERTY = re.compile(r"\s+(\S+)(\s+(.*\S))?\s*")
COMMENT = re.compile(r"\s*#")
DUPLICATE = "duplicate attribute"


class SectionValueError(Exception):
    """Raised by a file's value check: its text is the error parse_config records for the key."""


@dataclass(frozen=True)
class Entry:
    """One line inside a section: a property (`key`, `value`; value None when the line has none) or, with
    `key` None, a line parse_config ignores."""

    number: int  # the line's number in the file (1-based, comment lines counted)
    line: str
    key: str | None
    value: str | None


@dataclass(frozen=True)
class Section:
    """A section: its header line's match and number, and the lines up to the empty line that ends it."""

    number: int
    header: re.Match[str]
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Stray:
    """A line outside any section that is not a header (parse_config: `ignore config line`)."""

    number: int
    line: str


@dataclass(frozen=True)
class Problem:
    """A section line parse_config warns about: `err` None for a line it ignores, else the value's error
    (`duplicate attribute` or the check's text)."""

    entry: Entry
    err: str | None


def read_sections(text: str, header: re.Pattern[str] = TYPED_HEADER) -> list[Section | Stray]:
    """The sections and stray lines of `text` in file order (module docstring); never raises."""
    lines = text.split("\n")
    items: list[Section | Stray] = []
    number = 0
    current: tuple[int, re.Match[str], list[Entry]] | None = None
    for line in lines:
        number += 1
        if COMMENT.match(line):
            continue
        if current is None:
            if line == "":
                continue
            found = header.fullmatch(line)
            if found is None:
                items.append(Stray(number, line))
            else:
                current = (number, found, [])
            continue
        if line == "":
            items.append(Section(current[0], current[1], tuple(current[2])))
            current = None
            continue
        prop = PROPERTY.fullmatch(line)
        key, value = (prop[1], prop[3]) if prop else (None, None)
        current[2].append(Entry(number, line, key, value))
    if current is not None:
        items.append(Section(current[0], current[1], tuple(current[2])))
    return items


def properties(
    section: Section, check: Callable[[str, str | None], Any], arrays: Collection[str] = ()
) -> tuple[dict[str, Any], list[Problem]]:
    """The section's values as parse_config stores them, in file order, and the lines it warns about.

    `check(key, value)` returns the value to store or raises SectionValueError (the key's error; the value is
    dropped). A key in `arrays` collects every accepted value in a list; any other key already stored is a
    `duplicate attribute` error and keeps its first value (checked before `check`, as upstream)."""
    config: dict[str, Any] = {}
    problems: list[Problem] = []
    for entry in section.entries:
        if entry.key is None:
            problems.append(Problem(entry, None))
            continue
        try:
            if entry.key in arrays:
                value = check(entry.key, entry.value)
                config.setdefault(entry.key, []).append(value)
            else:
                if entry.key in config:
                    raise SectionValueError(DUPLICATE)
                config[entry.key] = check(entry.key, entry.value)
        except SectionValueError as problem:
            problems.append(Problem(entry, str(problem)))
    return config, problems
