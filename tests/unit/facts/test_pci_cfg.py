"""pci.cfg: the parser follows PVE::SectionConfig with PCI.pm's bare-id header, the writer is Proxmox's
canonical one, and `map` strings follow `$map_fmt`. Expected texts come from
shared/knowledge/proxmox-pci-mapping.md (the behaviours marked there as confirmed by running Proxmox's Perl)
and Proxmox's own fixtures (real/21).
"""

from __future__ import annotations

import re

import pytest

from pvegpu.facts.pci_cfg import CfgError, parse_pci_cfg, render_pci_cfg, replace_map_lines
from pvegpu.models.pve import MapEntry, MapEntryError, PciMapping, parse_map_entry
from tests.unit.realdata import real_fixture

MAP_A = "path=0000:01:00.0,node=pve1,id=10de:2204,subsystem-id=1458:403b,iommugroup=12"
MAP_B = "path=0000:41:00.0,node=pve2,id=10de:2204,subsystem-id=1458:403b,iommugroup=40"


def test_canonical_write_of_a_file_written_in_another_order() -> None:
    """The oracle case of the knowledge file: keys re-sorted (map first), entries verbatim, 0/1 booleans."""
    source = (
        f"gpu-a\n  mdev 0\n\tdescription first line only\n\tmap {MAP_A}\n"
        f"  live-migration-capable 0\n\tmap {MAP_B}\n"
    )
    parsed = parse_pci_cfg(source)
    assert (parsed.failed, parsed.errors, parsed.warnings) == ((), (), ())
    assert render_pci_cfg(parsed.mappings) == (
        "gpu-a\n"
        f"\tmap {MAP_A}\n"
        f"\tmap {MAP_B}\n"
        "\tdescription first line only\n"
        "\tlive-migration-capable 0\n"
        "\tmdev 0\n"
        "\n"
    )


def test_render_then_parse_round_trips() -> None:
    mappings = (
        PciMapping("gpu0", (MAP_A,)),
        PciMapping("gpu1", (MAP_B, MAP_A), description="two nodes", mdev=False, live_migration_capable=True),
    )
    text = render_pci_cfg(mappings)
    assert text == (
        f"gpu0\n\tmap {MAP_A}\n\ngpu1\n\tmap {MAP_B}\n\tmap {MAP_A}\n\tdescription two nodes\n"
        "\tlive-migration-capable 1\n\tmdev 0\n\n"
    )
    assert parse_pci_cfg(text).mappings == mappings


def test_error_invalid_id_skips_the_whole_section_with_the_warning() -> None:
    parsed = parse_pci_cfg(f"Bad.Id\n\tmap {MAP_A}\n\ngpu0\n\tmap {MAP_B}\n")
    assert parsed.warnings == (
        "file mapping/pci.cfg line 1 (skip section 'Bad.Id'): invalid configuration ID 'Bad.Id'",
    )
    assert parsed.mappings == (PciMapping("gpu0", (MAP_B,)),)


@pytest.mark.parametrize("value", ["on", "yes", "true", "2"])
def test_error_booleans_are_0_or_1_only(value: str) -> None:
    parsed = parse_pci_cfg(f"gpu0\n\tmap {MAP_A}\n\tmdev {value}\n")
    assert parsed.errors == (
        CfgError(
            "file mapping/pci.cfg line 3", "gpu0", "mdev", f"type check ('boolean') failed - got '{value}'"
        ),
    )
    assert parsed.mappings == (PciMapping("gpu0", (MAP_A,)),)  # the value is dropped, the section kept


def test_boolean_without_value_is_1() -> None:
    assert parse_pci_cfg(f"gpu0\n\tmap {MAP_A}\n\tmdev\n").mappings[0].mdev is True


def test_error_duplicate_attribute_keeps_the_section_and_the_first_value() -> None:
    parsed = parse_pci_cfg(f"gpu0\n\tdescription one\n\tmap {MAP_A}\n\tdescription two\n")
    assert parsed.errors == (
        CfgError("file mapping/pci.cfg line 4", "gpu0", "description", "duplicate attribute"),
    )
    assert parsed.mappings == (PciMapping("gpu0", (MAP_A,), description="one"),)


def test_blank_line_ends_a_section() -> None:
    parsed = parse_pci_cfg(f"gpu0\n\tmap {MAP_A}\n\n\tmap {MAP_B}\n")
    assert parsed.mappings == (PciMapping("gpu0", (MAP_A,)),)
    assert parsed.warnings == (f"file mapping/pci.cfg line 4 - ignore config line: \tmap {MAP_B}",)


def test_header_without_blank_line_before_is_ignored_and_its_lines_join_the_open_section() -> None:
    parsed = parse_pci_cfg(f"gpu0\n\tmap {MAP_A}\ngpu1\n\tmap {MAP_B}\n")
    assert parsed.mappings == (PciMapping("gpu0", (MAP_A, MAP_B)),)
    assert parsed.warnings == ("file mapping/pci.cfg line 3 (section 'gpu0') - ignore config line: gpu1",)


def test_comments_are_skipped_inside_sections_and_do_not_end_them() -> None:
    parsed = parse_pci_cfg(f"# managed by hand\ngpu0\n\tmap {MAP_A}\n  # note\n\tmap {MAP_B}\n")
    assert parsed.mappings == (PciMapping("gpu0", (MAP_A, MAP_B)),)
    assert parsed.warnings == ()


def test_error_section_without_a_valid_map_fails() -> None:
    parsed = parse_pci_cfg("gpu0\n\tmap node=pve1\n\ngpu1\n\tdescription none\n")
    assert parsed.mappings == ()
    assert parsed.failed == ("gpu0", "gpu1")
    assert parsed.errors == (
        CfgError(
            "file mapping/pci.cfg line 2",
            "gpu0",
            "map",
            "invalid format - id: property is missing and it is not optional; "
            "path: property is missing and it is not optional",
        ),
    )
    assert parsed.warnings[-1] == (
        "file mapping/pci.cfg line 4 (skip section 'gpu1'): missing value for required option 'map'"
    )


def test_error_unknown_section_key() -> None:
    parsed = parse_pci_cfg(f"gpu0\n\tmap {MAP_A}\n\tcolour red\n")
    assert [e.err for e in parsed.errors] == ["unexpected property 'colour'"]


def test_parse_map_entry_and_canonical_text() -> None:
    entry = parse_map_entry(MAP_A)
    assert entry == MapEntry("pve1", "0000:01:00.0", "10de:2204", "1458:403b", 12)
    assert entry.text == "id=10de:2204,node=pve1,path=0000:01:00.0,iommugroup=12,subsystem-id=1458:403b"
    assert parse_map_entry(entry.text) == entry


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0000:01:00.0", "value without key, but schema does not define a default key"),
        # what proxmoxer's list repr (`-map "['node=pve1,...', ...]"`) turns into
        (
            "['node=pve1,path=0000:01:00.0,id=10de:2204']",
            "invalid key in comma-separated list property: ['node",
        ),
        (
            "node=a,node=b,path=0000:01:00,id=10de:2204",
            "duplicate key in comma-separated list property: node",
        ),
        ("node=pve1,path=0000:C1:00,id=10de:2204", "path: value does not match the regex pattern"),
        ("node=pve1,path=01:00.0,id=10de:2204", "path: value does not match the regex pattern"),
        ("node=pve_1,path=0000:01:00,id=10de:2204", "node: value does not look like a valid node name"),
        (
            "node=pve1,path=0000:01:00,id=10de:2204,iommugroup=x",
            "iommugroup: type check ('integer') failed - got 'x'",
        ),
    ],
)
def test_error_map_entry(text: str, message: str) -> None:
    with pytest.raises(MapEntryError) as raised:
        parse_map_entry(text)
    assert str(raised.value) == message


def test_real_proxmox_fixture_map_strings_parse() -> None:
    """real/21: Proxmox's own test mapping (qemu-server run_config2command_tests.pl) and the pve-docs
    pvesh example."""
    text = real_fixture("21_proxmox_pci_mapping_test_fixture_and_docs_pvesh_example.txt").read_text()
    perl = re.findall(r"'(node=[^']+)'", text)
    docs = re.findall(r"--map (\S+)", text)
    assert len(perl) == 6
    assert [parse_map_entry(m) for m in perl[:2]] == [
        MapEntry("localhost", "0000:01:00.4", "10de:2231", None, 1),
        MapEntry("localhost", "0000:01:00.5", "10de:2231", None, 1),
    ]
    assert [parse_map_entry(m) for m in docs] == [
        MapEntry("node1", "0000:01:00.0", "0002:0001"),
        MapEntry("node2", "0000:02:00.0", "0002:0001"),
    ]
    # the documented pvesh call, stored as Proxmox stores it, parses back to the same section
    stored = render_pci_cfg([PciMapping("device1", tuple(docs))])
    assert parse_pci_cfg(stored).mappings == (PciMapping("device1", tuple(docs)),)


def test_replace_map_lines_rewrites_only_that_sections_line() -> None:
    """The same entry text in two sections: only the named section's line changes; its spaces, the comment
    and every other line stay as they were."""
    new = MAP_A.replace("iommugroup=12", "iommugroup=13")
    source = f"# c\ngpu0\n  map {MAP_A}  \n\tmdev 0\n\ngpu1\n\tmap {MAP_A}\n\tmap {MAP_B}\n"

    assert replace_map_lines(source, {("gpu0", MAP_A): new}) == (
        f"# c\ngpu0\n  map {new}  \n\tmdev 0\n\ngpu1\n\tmap {MAP_A}\n\tmap {MAP_B}\n"
    )
    assert replace_map_lines(source, {}) == source


@pytest.mark.parametrize(
    ("source", "count"),
    [
        (f"gpu0\n\tmap {MAP_B}\n", 0),
        (f"gpu0\n\tmap {MAP_A}\n# c\n\tmap {MAP_A}\n", 2),
        (f"gpu1\n\tmap {MAP_A}\n", 0),
    ],
)
def test_error_replace_map_lines_needs_exactly_one_line(source: str, count: int) -> None:
    with pytest.raises(
        ValueError, match=rf"^section gpu0 has {count} map lines '{re.escape(MAP_A)}', not one$"
    ):
        replace_map_lines(source, {("gpu0", MAP_A): MAP_B})
