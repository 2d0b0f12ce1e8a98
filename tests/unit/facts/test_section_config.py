"""pvegpu's one section-config reader (pvegpu/facts/section_config.py), against pve-common's
src/PVE/SectionConfig.pm `parse_config` (read from github:proxmox/pve-common): `$nextline` skips
`^\\s*#` lines; outside a section an empty line is skipped and a line that is no header is `ignore config
line`; inside one an empty line ends it, `^\\s+(\\S+)(\\s+(.*\\S))?\\s*$` is a property, anything else is
ignored; a non-array key already defined dies `duplicate attribute` (first value kept), an array key
pushes."""

from __future__ import annotations

import pytest

from pvegpu.facts.section_config import (
    DUPLICATE,
    ID_HEADER,
    Entry,
    Problem,
    Section,
    SectionValueError,
    Stray,
    properties,
    read_sections,
)


def keep(_key: str, value: str | None) -> str | None:
    return value


def only_numbers(_key: str, value: str | None) -> str:
    if value is None or not value.isdigit():
        raise SectionValueError(f"type check ('integer') failed - got '{value}'")
    return value


def sections(text: str, header: object = None) -> list[Section]:
    items = read_sections(text) if header is None else read_sections(text, ID_HEADER)
    return [item for item in items if isinstance(item, Section)]


def test_repeated_key_keeps_its_first_value_with_a_duplicate_attribute_error() -> None:
    (section,) = sections("dir: images\n\tpath /srv/images\n\tpath /srv/other\n\tcontent iso\n")
    values, problems = properties(section, keep)
    assert values == {"path": "/srv/images", "content": "iso"}
    assert problems == [Problem(Entry(3, "\tpath /srv/other", "path", "/srv/other"), DUPLICATE)]
    assert DUPLICATE == "duplicate attribute"


def test_array_key_keeps_every_value_and_other_keys_their_first() -> None:
    (section,) = sections("gpu0\n\tmap a\n\tdescription first\n\tmap b\n\tdescription second\n", ID_HEADER)
    values, problems = properties(section, keep, arrays=("map",))
    assert values == {"map": ["a", "b"], "description": "first"}
    assert [(p.entry.number, p.err) for p in problems] == [(5, DUPLICATE)]


def test_a_refused_value_is_not_stored_so_a_later_line_of_the_key_sets_it() -> None:
    (section,) = sections("local: 100-0\n\trate x\n\trate 5\n\trate 6\n")
    values, problems = properties(section, only_numbers)
    assert values == {"rate": "5"}
    assert [(p.entry.number, p.err) for p in problems] == [
        (2, "type check ('integer') failed - got 'x'"),
        (4, DUPLICATE),
    ]


def test_comments_blank_lines_and_stray_lines() -> None:
    text = "# top\nstray line\n\ndir: a\n  # indented comment\n\tpath /a\n   \ndir: b\n\tshared 1\n\n\tlost\n"
    text += "dir: c"
    items = read_sections(text)
    assert [type(item).__name__ for item in items] == ["Stray", "Section", "Stray", "Section"]
    stray, first, lost, last = items
    assert stray == Stray(2, "stray line")
    assert isinstance(first, Section)
    assert isinstance(last, Section)
    assert (first.number, first.header[1], first.header[2]) == (4, "dir", "a")
    # a line of spaces and a header without a blank line before it are ignored; the section goes on
    values, problems = properties(first, keep)
    assert values == {"path": "/a", "shared": "1"}
    assert [(p.entry.number, p.entry.line, p.err) for p in problems] == [
        (7, "   ", None),
        (8, "dir: b", None),
    ]
    assert [(e.key, e.value) for e in first.entries[2:]] == [(None, None), ("shared", "1")]
    assert lost == Stray(11, "\tlost")
    assert (last.number, last.header[2], last.entries) == (12, "c", ())


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [("\tdisable", "disable", None), ("  path  /srv/a b  ", "path", "/srv/a b"), ("\tkey\t\t", "key", None)],
)
def test_property_lines(line: str, key: str, value: str | None) -> None:
    (section,) = sections(f"dir: a\n{line}\n")
    assert section.entries == (Entry(2, line, key, value),)
