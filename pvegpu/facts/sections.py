"""Fact commands that print several things mark each with a line `#pvegpu:<name>`; this splits them again."""

from __future__ import annotations

from collections.abc import Sequence

from pvegpu.facts.errors import FactParseError

MARKER = "#pvegpu:"


def marker(name: str) -> str:
    """The marker line that opens section `name` (the command side)."""
    return f"{MARKER}{name}"


def split_sections(lines: Sequence[str], names: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
    """Lines of each section, with their 1-based line numbers. Pure.

    `names` is the exact order the command prints; its last name is the end marker and must be last.
    Raises FactParseError for a line before the first marker or after the end, an unknown or out-of-order
    marker, or a missing one (truncated output).
    """
    sections: dict[str, list[tuple[int, str]]] = {}
    current: str | None = None
    for number, line in enumerate(lines, start=1):
        if current == names[-1]:
            raise FactParseError(f"line {number}: {line!r} after the end marker")
        if line.startswith(MARKER):
            name = line[len(MARKER) :]
            if name not in names:
                raise FactParseError(f"line {number}: unknown section marker {line!r}")
            expected = names[len(sections)]
            if name != expected:
                raise FactParseError(f"line {number}: {line!r} where {marker(expected)} belongs")
            sections[name] = []
            current = name
        elif current is None:
            raise FactParseError(f"line {number}: {line!r} before the first section marker")
        else:
            sections[current].append((number, line))
    if len(sections) < len(names):
        raise FactParseError(f"truncated output: the {marker(names[len(sections)])} marker is missing")
    return sections
