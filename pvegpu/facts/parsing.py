"""What the facts' pure parsers share, stdlib only: their error classes and the section splitter.

Pure parsers raise `ParseError`; `pvegpu.facts.errors.FactParseError` is the same error as pyinfra reports it
per host (facts wrap their parsers with `errors.fact_errors`). Kept free of pyinfra so that the node's
pre-start hook (pvegpu/hook) runs the very parser the facts use, with nothing but the node's python3.
Fact commands that print several things mark each with a line `#pvegpu:<name>`; `split_sections` splits them.
A long listing is printed packed, ONE line of gzip then base64 (`PACK`, unpacked by `unpacked`): pyinfra reads
a command's output a line at a time in Python, so a thousand sysfs lines cost it more than the command does.
"""

from __future__ import annotations

import base64
import gzip
from collections.abc import Sequence


class ParseError(ValueError):
    """A command's output does not have the expected shape.

    The message names what was wrong: the device address and attribute (`0000:41:00.0: vendor: ...`) or the
    output line (`line 7: ...`).
    """


class FactCommandError(RuntimeError):
    """A fact command run locally (offline CLI, tests, the node's hook) exited non-zero; the message carries
    its stderr."""


MARKER = "#pvegpu:"


def marker(name: str) -> str:
    """The marker line that opens section `name` (the command side)."""
    return f"{MARKER}{name}"


def split_sections(lines: Sequence[str], names: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
    """Lines of each section, with their 1-based line numbers. Pure.

    `names` is the exact order the command prints; its last name is the end marker and must be last.
    Raises ParseError for a line before the first marker or after the end, an unknown or out-of-order
    marker, or a missing one (truncated output).
    """
    sections: dict[str, list[tuple[int, str]]] = {}
    current: str | None = None
    for number, line in enumerate(lines, start=1):
        if current == names[-1]:
            raise ParseError(f"line {number}: {line!r} after the end marker")
        if line.startswith(MARKER):
            name = line[len(MARKER) :]
            if name not in names:
                raise ParseError(f"line {number}: unknown section marker {line!r}")
            expected = names[len(sections)]
            if name != expected:
                raise ParseError(f"line {number}: {line!r} where {marker(expected)} belongs")
            sections[name] = []
            current = name
        elif current is None:
            raise ParseError(f"line {number}: {line!r} before the first section marker")
        else:
            sections[current].append((number, line))
    if len(sections) < len(names):
        raise ParseError(f"truncated output: the {marker(names[len(sections)])} marker is missing")
    return sections


# POSIX sh: the standard input packed into one line (gzip and base64 are in every Debian: Essential: yes).
PACK = "gzip -1 -n | base64 -w 0"


def unpacked(lines: Sequence[str], what: str) -> list[str]:
    """`PACK`'s one line -> the lines it packed. ParseError naming `what` for anything else."""
    text = [line for line in lines if line.strip()]
    try:
        if len(text) != 1:
            raise ValueError(f"{len(text)} lines")
        return gzip.decompress(base64.b64decode(text[0], validate=True)).decode().splitlines()
    except (ValueError, OSError, EOFError) as error:  # binascii.Error, gzip's BadGzipFile and a cut stream
        raise ParseError(f"{what}: not one line of gzip in base64 ({error})") from None
