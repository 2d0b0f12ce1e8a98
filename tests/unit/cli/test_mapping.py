"""`pvegpu mapping`: the pci.cfg text is a public interface. It must be exactly what Proxmox stores, parse
with Proxmox's grammar, and pass Proxmox's live check on the trees it came from (lab.fakesys trees).
`--against PCI_CFG` repairs a pci.cfg after a BIOS change, deciding as the node's hook does (plan/heal.py);
with `--owner ID` the sections carry pvegpu's mark and only marked mappings are repaired.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lab.fakesys import write_tree
from pvegpu.cli.main import main
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.facts.pci_cfg import parse_pci_cfg
from pvegpu.models.pve import MappingCheck, Severity
from tests.unit.proxmox_mapping_check import check_node

NAMES = (
    "reference",
    "reference-renumbered",
    "reference-missing-gpu",
    "reference-other-card",
    "shared-with-nic",
)
REFERENCE = [(41, 14), (51, 17), (61, 20), (71, 23), ("c1", 29), ("d1", 32), ("e1", 35), ("f1", 38)]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sys")
    for name in NAMES:
        write_tree(root / name, name)
    return {name: root / name for name in NAMES}


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["mapping", *map(str, args)])


def test_create_reference_prints_pci_cfg_exactly(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve1={trees['reference']}")
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == "".join(
        f"gpu{n}\n\tmap id=10de:2bb1,node=pve1,path=0000:{bus}:00,iommugroup={group},"
        "subsystem-id=10de:204b\n\n"
        for n, (bus, group) in enumerate(REFERENCE)
    )


def test_create_single_function_gpus_name_their_display_function(trees: dict[str, Path]) -> None:
    """`--single-function 0 --single-function 7`: what pvegpu writes for a GPUDirect clique of those GPUs;
    the file passes Proxmox's check (function .0 is what it checks either way)."""
    result = run("--node", f"pve1={trees['reference']}", "--single-function", "0", "--single-function", "7")
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == "".join(
        f"gpu{n}\n\tmap id=10de:2bb1,node=pve1,path=0000:{bus}:00{'.0' if n in (0, 7) else ''},"
        f"iommugroup={group},subsystem-id=10de:204b\n\n"
        for n, (bus, group) in enumerate(REFERENCE)
    )
    hw = read_hardware_locally(trees["reference"])
    sections = parse_pci_cfg(result.stdout).mappings
    assert [check_node(s, "pve1", hw) for s in sections] == [()] * 8


def test_two_nodes_parse_and_pass_proxmox_check_on_their_own_trees(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve2={trees['reference-renumbered']}", "--node", f"pve1={trees['reference']}")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:4] == [
        "gpu0",
        "\tmap id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:204b",
        "\tmap id=10de:2bb1,node=pve2,path=0000:21:00,iommugroup=16,subsystem-id=10de:204b",
        "",
    ]
    parsed = parse_pci_cfg(result.stdout)
    assert (parsed.failed, parsed.errors, parsed.warnings) == ((), (), ())
    assert [m.id for m in parsed.mappings] == [f"gpu{n}" for n in range(8)]
    hardware = {
        "pve1": read_hardware_locally(trees["reference"]),
        "pve2": read_hardware_locally(trees["reference-renumbered"]),
    }
    for mapping in parsed.mappings:
        for node, hw in hardware.items():
            assert check_node(mapping, node, hw) == ()


def test_bios_renumbered_old_output_fails_proxmox_check(trees: dict[str, Path]) -> None:
    old = parse_pci_cfg(run("--node", f"pve1={trees['reference']}").stdout)
    renumbered = read_hardware_locally(trees["reference-renumbered"])
    assert [check_node(m, "pve1", renumbered) for m in old.mappings[:2]] == [
        (
            MappingCheck(
                Severity.ERROR, "Invalid configuration: 'iommugroup' does not match for 'gpu0' (22 != 14)\n"
            ),
        ),
        (
            MappingCheck(
                Severity.ERROR, "Invalid configuration: 'iommugroup' does not match for 'gpu1' (25 != 17)\n"
            ),
        ),
    ]


def test_prefix_and_id_options(trees: dict[str, Path]) -> None:
    result = run(
        "--node", f"pve1={trees['reference']}", "--id", "10DE:2BB1", "--count", "8", "--prefix", "rtx"
    )
    assert result.exit_code == 0
    assert result.stdout.startswith("rtx0\n\tmap id=10de:2bb1,node=pve1,path=0000:41:00,")


def test_error_refused_gpu_exits_1_and_prints_nothing_on_stdout(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve1={trees['reference']}", "--node", f"pve2={trees['shared-with-nic']}")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        "pvegpu: pve2: gpu3 0000:73:00 (10de:2bb1) is refused: IOMMU group 21 also holds 0000:74:00.0 "
        "(Ethernet controller [0200] 15b3:101d); pass the whole group or move the card\n"
    )


def test_error_count_exits_1(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve1={trees['reference']}", "--count", "4")
    assert (result.exit_code, result.stderr) == (
        1,
        "pvegpu: pve1: expected 4 GPUs with id 10de:2bb1, found 8\n",
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("pve1", "'pve1' is not NAME=SYSFS_DIR"),
        ("pve_1=/sys", "'pve_1' is not a Proxmox node name"),
    ],
)
def test_error_bad_node_option_exits_2(value: str, message: str) -> None:
    result = run("--node", value)
    assert result.exit_code == 2
    assert message in result.stderr


def test_error_node_given_twice_exits_2(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve1={trees['reference']}", "--node", f"pve1={trees['reference']}")
    assert result.exit_code == 2
    assert "node pve1 is given twice" in result.stderr


def test_error_bad_prefix_exits_2(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve1={trees['reference']}", "--prefix", "9")
    assert result.exit_code == 2
    assert "mapping prefix '9' gives '90', not a Proxmox mapping id" in result.stderr


def test_error_unreadable_tree_exits_2(tmp_path: Path) -> None:
    result = run("--node", f"pve1={tmp_path / 'missing'}")
    assert (result.exit_code, result.stderr) == (
        2,
        f"pvegpu: cannot read {tmp_path / 'missing'}: no such directory\n",
    )


# --- --against: repair a pci.cfg ----------------------------------------------------------------------------

UNMANAGED = "# kept: a comment\nnic0\n\tmap id=15b3:101d,node=pve1,path=0000:01:00.0,iommugroup=8\n\n"
PVE3 = "path=0000:41:00,node=pve3,id=10de:2bb1,subsystem-id=10de:204b,iommugroup=14"


@pytest.fixture(scope="module")
def reference_cfg(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pvegpu's mappings of the reference box as pve1, with a pve3 line (GUI key order) before each pve1
    line and someone else's section first, comment included: all of it must come back byte for byte."""
    written = run("--node", f"pve1={trees['reference']}").stdout
    text = UNMANAGED + written.replace("\tmap id=", f"\tmap {PVE3}\n\tmap id=")
    path = tmp_path_factory.mktemp("cfg") / "pci.cfg"
    path.write_text(text)
    return path


def against(cfg: Path, *nodes: str) -> Result:
    return run(*(arg for node in nodes for arg in ("--node", node)), "--against", cfg)


def proxmox_check_fails(stdout: str, node: str, tree: Path) -> list[int]:
    """The GPU indices whose mapping fails Proxmox's check on `node` with `tree` (the file parses cleanly)."""
    parsed = parse_pci_cfg(stdout)
    assert (parsed.failed, parsed.errors, parsed.warnings) == ((), (), ())
    hw = read_hardware_locally(tree)
    managed = [m for m in parsed.mappings if m.id.startswith("gpu")]
    assert [m.id for m in managed] == [f"gpu{n}" for n in range(8)]
    return [n for n, mapping in enumerate(managed) if check_node(mapping, node, hw) != ()]


def test_against_same_box_is_unchanged_byte_for_byte(trees: dict[str, Path], reference_cfg: Path) -> None:
    result = against(reference_cfg, f"pve1={trees['reference']}")

    assert (result.exit_code, result.stdout) == (0, reference_cfg.read_text())
    assert result.stderr == "".join(f"gpu{n} pve1: unchanged\n" for n in range(8))


def test_bios_renumbered_repairs_every_gpu_and_passes_proxmox_check(
    trees: dict[str, Path], reference_cfg: Path
) -> None:
    result = against(reference_cfg, f"pve1={trees['reference-renumbered']}")

    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        f"gpu{n} pve1: 0000:{old}:00 group {was} -> 0000:{new}:00 group {now}, repaired"
        for n, (old, was, new, now) in enumerate(
            [
                ("41", 14, "21", 16),
                ("51", 17, "31", 19),
                ("61", 20, "41", 22),
                ("71", 23, "51", 25),
                ("c1", 29, "a1", 31),
                ("d1", 32, "b1", 34),
                ("e1", 35, "c1", 37),
                ("f1", 38, "d1", 40),
            ]
        )
    ]
    # What `pvegpu mapping` writes for the renumbered box, with the other lines exactly as they were.
    fresh = run("--node", f"pve1={trees['reference-renumbered']}").stdout
    assert result.stdout == UNMANAGED + fresh.replace("\tmap id=", f"\tmap {PVE3}\n\tmap id=")
    assert proxmox_check_fails(result.stdout, "pve1", trees["reference-renumbered"]) == []
    # A second run on the repaired file changes nothing.
    reference_cfg.with_name("repaired.cfg").write_text(result.stdout)
    again = against(reference_cfg.with_name("repaired.cfg"), f"pve1={trees['reference-renumbered']}")
    assert (again.exit_code, again.stdout) == (0, result.stdout)


MISSING = "7 GPUs found for 8 mappings of pve1: a card is missing"


@pytest.mark.parametrize(
    ("box", "refused"),
    [
        (
            "reference-missing-gpu",
            {
                3: f"gpu3 pve1: 0000:71:00 group 23: no device there now; {MISSING}, not repaired",
                4: f"gpu4 pve1: 0000:c1:00 group 29 -> group 28; {MISSING}, not repaired",
                5: f"gpu5 pve1: 0000:d1:00 group 32 -> group 31; {MISSING}, not repaired",
                6: f"gpu6 pve1: 0000:e1:00 group 35 -> group 34; {MISSING}, not repaired",
                7: f"gpu7 pve1: 0000:f1:00 group 38 -> group 37; {MISSING}, not repaired",
            },
        ),
        (
            "reference-other-card",
            {
                5: "gpu5 pve1: slot 6 held 10de:2bb1 subsystem 10de:204b at 0000:d1:00, now 10de:26b1 "
                "subsystem 10de:16a1 at 0000:d1:00: another model, not repaired",
            },
        ),
    ],
)
def test_error_hardware_changed_exits_1_and_leaves_the_file_as_it_was(
    trees: dict[str, Path], reference_cfg: Path, box: str, refused: dict[int, str]
) -> None:
    result = against(reference_cfg, f"pve1={trees[box]}")

    assert (result.exit_code, result.stdout) == (1, reference_cfg.read_text())
    assert result.stderr.splitlines() == [refused.get(n, f"gpu{n} pve1: unchanged") for n in range(8)]
    # Proxmox's own check fails exactly the refused ones: the VM would not start.
    assert proxmox_check_fails(result.stdout, "pve1", trees[box]) == sorted(refused)


def test_two_nodes_each_decided_on_its_own_tree(trees: dict[str, Path], tmp_path: Path) -> None:
    both = run("--node", f"pve1={trees['reference']}", "--node", f"pve2={trees['reference']}").stdout
    cfg = tmp_path / "pci.cfg"
    cfg.write_text(both)

    result = against(cfg, f"pve2={trees['reference-renumbered']}", f"pve1={trees['reference']}")

    assert result.exit_code == 0
    assert result.stderr.splitlines()[:9] == [
        *(f"gpu{n} pve1: unchanged" for n in range(8)),
        "gpu0 pve2: 0000:41:00 group 14 -> 0000:21:00 group 16, repaired",
    ]
    expected = run(
        "--node", f"pve1={trees['reference']}", "--node", f"pve2={trees['reference-renumbered']}"
    ).stdout
    assert result.stdout == expected
    assert proxmox_check_fails(result.stdout, "pve1", trees["reference"]) == []
    assert proxmox_check_fails(result.stdout, "pve2", trees["reference-renumbered"]) == []


def test_create_with_owner_marks_each_section_as_pvegpu_writes_it(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve1={trees['reference']}", "--owner", "dc-1")
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == "".join(
        f"gpu{n}\n\tmap id=10de:2bb1,node=pve1,path=0000:{bus}:00,iommugroup={group},"
        "subsystem-id=10de:204b\n\tdescription pvegpu-owner: dc-1\n\n"
        for n, (bus, group) in enumerate(REFERENCE)
    )


def test_against_with_owner_repairs_only_marked_mappings(trees: dict[str, Path], tmp_path: Path) -> None:
    marked = run("--node", f"pve1={trees['reference']}", "--owner", "dc-1").stdout
    gpu0_unmarked = marked.replace("\tdescription pvegpu-owner: dc-1\n", "", 1)
    cfg, renumbered = tmp_path / "pci.cfg", f"pve1={trees['reference-renumbered']}"
    cfg.write_text(gpu0_unmarked)
    refused = run("--node", renumbered, "--against", cfg, "--owner", "dc-1")
    cfg.write_text(marked)
    repaired = run("--node", renumbered, "--against", cfg, "--owner", "dc-1")

    assert (refused.exit_code, refused.stdout) == (1, gpu0_unmarked)
    assert refused.stderr.splitlines()[:2] == [
        "gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16 is a renumbering, but mapping gpu0 is not "
        "pvegpu's (no pvegpu mark; mapping.adopt: true adopts it), not repaired",
        "gpu1 pve1: 0000:51:00 group 17 -> 0000:31:00 group 19 is a renumbering, but gpu0 of pve1 is not "
        "pvegpu's, not repaired",
    ]
    assert (repaired.exit_code, repaired.stderr.splitlines()[0]) == (
        0,
        "gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16, repaired",
    )
    fresh = run("--node", renumbered, "--owner", "dc-1").stdout
    assert repaired.stdout == fresh


def test_error_owner_that_is_no_owner_id_is_a_usage_error(trees: dict[str, Path]) -> None:
    result = run("--node", f"pve1={trees['reference']}", "--owner", "a b")
    assert result.exit_code == 2
    assert "'a b' is not an owner id (letters, digits, - and _)" in result.stderr


def test_error_against_unreadable_file_exits_2(trees: dict[str, Path], tmp_path: Path) -> None:
    result = against(tmp_path / "missing.cfg", f"pve1={trees['reference']}")

    assert (result.exit_code, result.stdout, result.stderr) == (
        2,
        "",
        f"pvegpu: cannot read {tmp_path / 'missing.cfg'}: No such file or directory\n",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "it holds no mapping gpu<N>"),
        ("gpu0\n\tmap id=10de:2bb1,node=pve1\n\n", "Proxmox drops lines of gpu0"),
    ],
)
def test_error_against_file_without_readable_mappings_exits_2(
    trees: dict[str, Path], tmp_path: Path, text: str, message: str
) -> None:
    cfg = tmp_path / "pci.cfg"
    cfg.write_text(text)

    result = against(cfg, f"pve1={trees['reference']}")

    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.splitlines()[0] == f"pvegpu: cannot read {cfg}: {message}"


def test_error_against_with_count_is_a_usage_error(trees: dict[str, Path], reference_cfg: Path) -> None:
    result = run("--node", f"pve1={trees['reference']}", "--count", "8", "--against", reference_cfg)

    assert result.exit_code == 2
    assert (
        "--against decides on the GPUs the mappings name, keeping each line's shape: no --id, --count or "
        "--single-function"
    ) in " ".join(result.stderr.replace("│", " ").split())
