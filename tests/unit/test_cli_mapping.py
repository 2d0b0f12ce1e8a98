"""`pvegpu mapping`: the pci.cfg text is a public interface. It must be exactly what Proxmox stores, parse
with Proxmox's grammar, and pass Proxmox's live check on the trees it came from (lab.fakesys trees).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lab.fakesys import write_tree
from pvegpu.cli import main
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.facts.pci_cfg import parse_pci_cfg
from pvegpu.models.pve import MappingCheck, Severity
from tests.unit.proxmox_mapping_check import check_node

NAMES = ("reference", "reference-renumbered", "shared-with-nic")
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
