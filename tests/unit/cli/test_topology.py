"""`pvegpu topology`: the table, the public JSON shape and the exit status, on trees written by lab.fakesys
(synthetic boxes, see lab/topologies.py) and on broken inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lab.fakesys import manifest, write_tree
from pvegpu.cli.main import main
from pvegpu.cli.report import format_link
from pvegpu.models.hardware import Link

REPO = Path(__file__).resolve().parents[3]


# Ground truth from the generator: what each tree holds.
MANIFESTS = {name: manifest(name) for name in ("reference", "reference-renumbered", "shared-with-nic")}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sys")
    for name, expected in MANIFESTS.items():
        assert write_tree(root / name, name) == expected
    return {name: root / name for name in MANIFESTS}


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["topology", *map(str, args)])


def test_reference_json_eight_passable_cards(trees: dict[str, Path]) -> None:
    result = run("--sysfs-root", trees["reference"], "--json")
    assert (result.exit_code, result.stderr) == (0, "")
    document = json.loads(result.stdout)
    assert document["gpus"][0] == {
        "name": "gpu0",
        "address": "0000:41:00",
        "functions": ["0000:41:00.0", "0000:41:00.1"],
        "id": "10de:2bb1",
        "subsystem_id": "10de:204b",
        "iommu_group": 14,
        "root_bus": "0000:40",
        "numa_node": 0,
        "verdict": "passable",
        "reason": None,
    }
    gpus = document["gpus"]
    assert [(g["name"], g["address"], g["root_bus"], g["numa_node"]) for g in gpus] == [
        ("gpu0", "0000:41:00", "0000:40", 0),
        ("gpu1", "0000:51:00", "0000:50", 0),
        ("gpu2", "0000:61:00", "0000:60", 0),
        ("gpu3", "0000:71:00", "0000:70", 0),
        ("gpu4", "0000:c1:00", "0000:c0", 1),
        ("gpu5", "0000:d1:00", "0000:d0", 1),
        ("gpu6", "0000:e1:00", "0000:e0", 1),
        ("gpu7", "0000:f1:00", "0000:f0", 1),
    ]
    assert all(g["functions"] == [g["address"] + ".0", g["address"] + ".1"] for g in gpus)
    assert len({g["iommu_group"] for g in gpus}) == 8
    truth = [
        {k: g[k] for k in ("address", "functions", "iommu_group", "numa_node", "root_bus")} for g in gpus
    ]
    assert truth == [
        {k: g[k] for k in ("address", "functions", "iommu_group", "numa_node", "root_bus")}
        for g in MANIFESTS["reference"]["gpus"]
    ]
    assert {(g["verdict"], g["reason"]) for g in gpus} == {("passable", None)}
    assert (document["order_key"], document["problems"]) == ("numa node, physical slot", [])


def test_reference_table(trees: dict[str, Path]) -> None:
    result = run("--sysfs-root", trees["reference"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        "gpu   address     model ids            group  root bus  NUMA  link           verdict",
        "gpu0  0000:41:00  10de:2bb1 10de:204b  14     0000:40   0     32.0 GT/s x16  passable",
        "gpu1  0000:51:00  10de:2bb1 10de:204b  17     0000:50   0     32.0 GT/s x16  passable",
    ]
    assert lines[9:] == ["", "order: numa node, physical slot"]


def test_bios_renumbered_keeps_names_on_slots(trees: dict[str, Path]) -> None:
    """After the BIOS change 0000:41:00 holds the card of slot 3, so it is gpu2 (it was gpu0's address)."""
    names_by_slot = {}
    for name in ("reference", "reference-renumbered"):
        devices = MANIFESTS[name]["devices"]
        gpus = json.loads(run("--sysfs-root", trees[name], "--json").stdout)["gpus"]
        names_by_slot[name] = {g["name"]: devices[g["functions"][0]]["physical_slot"] for g in gpus}
        if name == "reference-renumbered":
            assert [g["address"] for g in gpus][:3] == ["0000:21:00", "0000:31:00", "0000:41:00"]
            assert [g["iommu_group"] for g in gpus] == [16, 19, 22, 25, 31, 34, 37, 40]
    assert names_by_slot["reference"] == {f"gpu{n}": str(n + 1) for n in range(8)}
    assert names_by_slot["reference-renumbered"] == names_by_slot["reference"]


def test_error_shared_with_nic_refuses_gpu3_naming_the_nic(trees: dict[str, Path]) -> None:
    result = run("--sysfs-root", trees["shared-with-nic"], "--json")
    assert result.exit_code == 1
    gpus = json.loads(result.stdout)["gpus"]
    assert [g["verdict"] for g in gpus] == ["passable"] * 3 + ["refused"] + ["passable"] * 4
    assert gpus[3]["reason"] == (
        "IOMMU group 21 also holds 0000:74:00.0 (Ethernet controller [0200] 15b3:101d); "
        "pass the whole group or move the card"
    )


def test_error_shared_with_nic_table_lists_the_reason(trees: dict[str, Path]) -> None:
    result = run("--sysfs-root", trees["shared-with-nic"])
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-2:] == [
        "order: numa node, physical slot",
        "gpu3: IOMMU group 21 also holds 0000:74:00.0 (Ethernet controller [0200] 15b3:101d); "
        "pass the whole group or move the card",
    ]
    assert result.stdout.splitlines()[4] == (
        "gpu3  0000:73:00  10de:2bb1 10de:204b  21     0000:70   0     16.0 GT/s x16 (max 32.0 GT/s x16)  "
        "refused"
    )


def test_error_count_mismatch_exits_1_with_the_problem(trees: dict[str, Path]) -> None:
    result = run("--sysfs-root", trees["reference"], "--count", "7")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == "problem: expected 7 GPUs with id 10de:2bb1, found 8"


def test_id_selects_models_case_insensitively(trees: dict[str, Path]) -> None:
    result = run("--sysfs-root", trees["reference"], "--json", "--id", "10DE:2BB1", "--count", "8")
    assert result.exit_code == 0
    assert len(json.loads(result.stdout)["gpus"]) == 8


def test_error_id_of_no_display_function(trees: dict[str, Path]) -> None:
    """10de:22e8 is the cards' audio function: not a GPU."""
    result = run("--sysfs-root", trees["reference"], "--json", "--id", "10de:22e8")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "gpus": [],
        "order_key": "numa node, root bus, bus address",
        "problems": ["no display function has id 10de:22e8"],
    }


def test_error_bad_id_is_a_usage_error(trees: dict[str, Path]) -> None:
    result = run("--sysfs-root", trees["reference"], "--id", "nvidia")
    assert result.exit_code == 2
    assert "Invalid value for '--id': 'nvidia' is not a vendor:device id like 10de:2bb1" in result.stderr


def test_error_unreadable_inputs_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    device = broken / "devices/pci0000:40/0000:40:01.1/0000:41:00.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n")
    (broken / "bus/pci/devices").mkdir(parents=True)
    (broken / "bus/pci/devices/0000:41:00.0").symlink_to(
        "../../../devices/pci0000:40/0000:40:01.1/0000:41:00.0"
    )
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("")
    expected = {
        "missing": "no such directory",
        "file": "not a directory",
        "empty": "no PCI devices under bus/pci/devices (not a sysfs tree?)",
        "broken": "0000:41:00.0: device: missing (no such attribute file, or it is empty)",
    }
    for name, reason in expected.items():
        result = run("--sysfs-root", tmp_path / name, "--json")
        assert (result.exit_code, result.stdout, result.stderr) == (
            2,
            "",
            f"pvegpu: cannot read {tmp_path / name}: {reason}\n",
        ), name


def test_real_subprocess_exit_status_and_json(trees: dict[str, Path]) -> None:
    """Once through a real process: `python -m pvegpu` (what the console script runs)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "pvegpu", "topology", "--json", "--sysfs-root"]
    ok = subprocess.run(
        [*command, str(trees["reference"])], env=env, capture_output=True, text=True, check=False
    )
    refused = subprocess.run(
        [*command, str(trees["shared-with-nic"])], env=env, capture_output=True, text=True, check=False
    )
    assert (ok.returncode, ok.stderr, len(json.loads(ok.stdout)["gpus"])) == (0, "", 8)
    assert (refused.returncode, json.loads(refused.stdout)["gpus"][3]["verdict"]) == (1, "refused")


@pytest.mark.parametrize(
    ("link", "text"),
    [
        (Link(32.0, 16, 32.0, 16), "32.0 GT/s x16"),
        (Link(2.5, 16, 32.0, 16), "2.5 GT/s x16 (max 32.0 GT/s x16)"),
        (Link(None, 8, 16.0, 16), "? GT/s x8 (max 16.0 GT/s x16)"),
        (None, "-"),
    ],
)
def test_format_link(link: Link | None, text: str) -> None:
    assert format_link(link) == text
