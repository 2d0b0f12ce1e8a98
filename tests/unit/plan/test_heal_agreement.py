"""`pvegpu mapping --against` and the node's pre-start hook decide alike, on every ordered pair of lab boxes
with the reference's cards (every lab topology with an NVIDIA GPU): the pci.cfg `pvegpu mapping --owner lab`
writes for `before` (where it writes one: marked as pvegpu's), decided on the tree of `after`, by both with
the same owner id.

The CLI runs as the operator runs it (`python -m pvegpu`, a subprocess); the hook's side is its decision
code (pvegpu/hook/decide.py) on the same file and tree, for a VM that maps every GPU. Per pair: the hook's
lines are the CLI's stderr lines, prefixed; the hook's repairs written into the file give the CLI's stdout
byte for byte; the exit status is 0 exactly when the hook lets the start go on. What they agree on is
pinned too: unchanged on the same box, repaired between boxes with the same cards in the same firmware
slots, refused otherwise. A repaired file passes Proxmox's own check (tests/unit/proxmox_mapping_check.py)
on the `after` tree; a refused one is printed as it was, and Proxmox's check fails on it too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.fakesys import TOPOLOGIES, write_tree
from pvegpu.facts.hardware_parse import read_hardware_locally
from pvegpu.facts.pci_cfg import parse_pci_cfg, replace_map_lines
from pvegpu.hook.decide import PREFIX, Decision, Mode, Start, decide
from pvegpu.models.hardware import HostHardware
from pvegpu.plan.topology import display_ids
from tests.unit.proxmox_mapping_check import check_node

REPO = Path(__file__).resolve().parents[3]
NODE = "pve1"
WORKERS = os.cpu_count() or 2  # the CLI runs are subprocesses: side by side, one per core
OWNER = "lab"
START = Start(100, NODE, Mode.REPAIR, "gpu", OWNER)
BOXES = tuple(name for name in TOPOLOGIES if name != "qemu-probe")  # qemu-probe has no NVIDIA card
# `pvegpu mapping` refuses shared-with-nic's gpu3 (its group holds a NIC): it is only ever the box after.
BEFORE = tuple(name for name in BOXES if name != "shared-with-nic")
# The same 8 cards of one model in firmware slots 1..8: between these, only numbers change.
SAME_CARDS = ("reference", "reference-renumbered", "switches", "switches-noacs")


@dataclass(frozen=True)
class Box:
    tree: Path
    hw: HostHardware
    cfg: Path | None  # the pci.cfg `pvegpu mapping` writes for the box; None where it refuses to write one


@dataclass(frozen=True)
class Against:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Box]:
    root = tmp_path_factory.mktemp("heal")

    def make(name: str) -> Box:
        write_tree(root / name, name)
        written = cli("mapping", "--node", f"{NODE}={root / name}", "--owner", OWNER)
        cfg = None
        if written.returncode == 0:
            cfg = root / f"{name}.cfg"
            cfg.write_text(written.stdout, encoding="utf-8")
        return Box(root / name, read_hardware_locally(root / name), cfg)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return dict(zip(TOPOLOGIES, pool.map(make, TOPOLOGIES), strict=True))


@pytest.fixture(scope="module")
def against(boxes: dict[str, Box]) -> dict[tuple[str, str], Against]:
    """`pvegpu mapping --node pve1=<after> --against <before's pci.cfg>` for every pair, run side by side."""
    pairs = [(before, after) for before in BEFORE for after in BOXES]

    def run(pair: tuple[str, str]) -> Against:
        before, after = pair
        cfg = boxes[before].cfg
        assert cfg is not None
        return cli(
            "mapping", "--node", f"{NODE}={boxes[after].tree}", "--against", str(cfg), "--owner", OWNER
        )

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return dict(zip(pairs, pool.map(run, pairs), strict=True))


def cli(*args: str) -> Against:
    done = subprocess.run(
        [sys.executable, "-m", "pvegpu", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Against(done.returncode, done.stdout, done.stderr)


def hook(box: Box, after: Box) -> tuple[str, Decision]:
    """The pci.cfg text and the hook's decision for VM 100 mapping every GPU of it, on `after`'s hardware."""
    assert box.cfg is not None
    text = box.cfg.read_text(encoding="utf-8")
    sections = parse_pci_cfg(text).mappings
    config = "".join(f"hostpci{n}: mapping={s.id},pcie=1\n" for n, s in enumerate(sections)) + "name: llm\n"
    return text, decide(START, config, sections, after.hw)


def written(text: str, decision: Decision) -> str:
    """`text` after the hook's repairs: each repaired section's changed `map` lines replaced."""
    replacements = {
        (repair.mapping, old): new
        for repair in decision.repairs
        for old, new in zip(repair.old, repair.new, strict=True)
        if old != new
    }
    return replace_map_lines(text, replacements)


def expected(before: str, after: str) -> str:
    if before == after:
        return "unchanged"
    return "repaired" if {before, after} <= set(SAME_CARDS) else "refused"


def test_the_pairs_are_every_lab_box_with_cards(boxes: dict[str, Box]) -> None:
    with_cards = {name for name, box in boxes.items() if display_ids(box.hw, "10de")}
    assert with_cards == set(BOXES)
    assert {
        "reference",
        "reference-renumbered",
        "reference-missing-gpu",
        "reference-other-card",
    } <= with_cards
    assert {name for name, box in boxes.items() if box.cfg is not None} == set(BEFORE)


@pytest.mark.parametrize("before", BEFORE)
@pytest.mark.parametrize("after", BOXES)
def test_cli_and_hook_agree_and_repairs_pass_proxmox_check(
    boxes: dict[str, Box], against: dict[tuple[str, str], Against], before: str, after: str
) -> None:
    result = against[before, after]
    text, decision = hook(boxes[before], boxes[after])
    gpu_lines = result.stderr.splitlines()
    sections = parse_pci_cfg(result.stdout).mappings
    failing = [s.id for s in parse_pci_cfg(text).mappings if check_node(s, NODE, boxes[after].hw)]
    outcome = expected(before, after)

    if outcome == "unchanged":
        assert gpu_lines == [f"{s.id} {NODE}: unchanged" for s in sections]
        assert decision == Decision(
            (f"{PREFIX}VM 100 on {NODE}: {len(sections)} GPU mappings valid",), (), False
        )
    elif outcome == "repaired":
        assert [line.endswith(", repaired") for line in gpu_lines] == [True] * len(sections)
        assert decision.lines == tuple(PREFIX + line for line in gpu_lines)
        assert (len(decision.repairs), decision.refused) == (len(sections), False)
    else:
        assert any(line.endswith(", not repaired") for line in gpu_lines), gpu_lines
        assert decision.lines[:-1] == tuple(PREFIX + line for line in gpu_lines)
        assert decision.lines[-1] == (
            f"{PREFIX}VM 100 not started: the GPUs of {NODE} changed, not only their numbers; check the "
            "hardware, then run: pyinfra inventory.py deploy/rebuild_vm.py"
        )
        assert (decision.repairs, decision.refused) == ((), True)
    assert result.returncode == (1 if decision.refused else 0), result.stderr
    assert result.stdout == written(text, decision)
    if decision.refused:
        assert result.stdout == text
        assert failing  # the hook refuses no start that Proxmox's own check would let through
    else:
        assert [check_node(s, NODE, boxes[after].hw) for s in sections] == [()] * len(sections)
        assert failing == [repair.mapping for repair in decision.repairs]


def test_single_function_paths_keep_their_shape_in_the_cli_and_the_hook(
    boxes: dict[str, Box], tmp_path: Path
) -> None:
    """The GPUs a clique passes single-function (`path=...:41:00.0`, plan/mapping.py) stay single-function
    when renumber-only drift is repaired, by the hook and by `pvegpu mapping --against` alike; the whole
    slots stay whole; the repaired file passes Proxmox's check on the renumbered box."""
    reference, renumbered = boxes["reference"], boxes["reference-renumbered"]
    assert reference.cfg is not None
    text = reference.cfg.read_text(encoding="utf-8")
    text = text.replace("path=0000:41:00,", "path=0000:41:00.0,").replace(
        "path=0000:f1:00,", "path=0000:f1:00.0,"
    )
    cfg = tmp_path / "pci.cfg"
    cfg.write_text(text, encoding="utf-8")
    sections = parse_pci_cfg(text).mappings
    config = "".join(f"hostpci{n}: mapping={s.id},pcie=1\n" for n, s in enumerate(sections))
    decision = decide(START, config, sections, renumbered.hw)
    result = cli("mapping", "--node", f"{NODE}={renumbered.tree}", "--against", str(cfg), "--owner", OWNER)

    assert result.returncode == 0, result.stderr
    assert result.stdout == written(text, decision)
    assert (
        decision.lines[0] == f"{PREFIX}gpu0 {NODE}: 0000:41:00.0 group 14 -> 0000:21:00.0 group 16, repaired"
    )
    assert decision.lines[1] == f"{PREFIX}gpu1 {NODE}: 0000:51:00 group 17 -> 0000:31:00 group 19, repaired"
    assert (
        decision.lines[7] == f"{PREFIX}gpu7 {NODE}: 0000:f1:00.0 group 38 -> 0000:d1:00.0 group 40, repaired"
    )
    repaired = parse_pci_cfg(result.stdout).mappings
    assert repaired[0].map == (
        f"id=10de:2bb1,node={NODE},path=0000:21:00.0,iommugroup=16,subsystem-id=10de:204b",
    )
    assert [check_node(s, NODE, renumbered.hw) for s in repaired] == [()] * len(repaired)
