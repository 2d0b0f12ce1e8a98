"""The hook's bundle with `--gauges` (pvegpu/hook/live_gauges.py), what the node's gauges timer runs: on the
lab's real sysfs trees (lab/fakesys.py) and a /etc/pve as pvegpu writes it, per GPU the mapping's health as
the pre-start hook would decide it in `check` mode, in `pvegpu_mappings.prom`, with nothing printed, nothing
written to Proxmox and no file but its own."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from pvegpu.hook import live_gauges as live_gauges_module
from pvegpu.hook.bundle import PYTHON
from pvegpu.hook.decide import Mode, Start
from pvegpu.hook.live_gauges import mapping_health
from pvegpu.hook.main import main
from pvegpu.models.hardware import HostHardware
from pvegpu.plan.gauges import MappingHealth
from tests.unit.hook.test_hook import CONFIG, OWNER, hw, mapped, node_root, trees, zipapp

__all__ = ["hw", "trees", "zipapp"]  # the module fixtures this file uses

BUSES = ("41", "51", "61", "71", "c1", "d1", "e1", "f1")  # the reference topology's GPUs, in order
CHECK = Start(100, "pve1", Mode.CHECK, "gpu", OWNER)
STAMP = re.compile(r'pvegpu_mapping_checked_timestamp_seconds\{node="[^"]+",vmid="100"\} [0-9]+')


def check(
    zipapp: Path, tmp_path: Path, hw: HostHardware, sysfs: Path
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`--gauges` for VM 100 on a node whose pci.cfg holds `hw`'s mappings and whose live tree is `sysfs`:
    (the run, the textfile directory)."""
    root, pvesh = node_root(tmp_path, hw)
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    argv = [PYTHON, str(zipapp), "--gauges", "--pve-root", str(root), "--sysfs-root", str(sysfs)]
    argv += ["--pvesh", str(pvesh), "--owner", OWNER, "--textfile-dir", str(textfiles), "100"]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60), textfiles


def samples(textfiles: Path) -> list[str]:
    """The file's sample lines, its check time last (checked, then dropped)."""
    lines = [line for line in (textfiles / "pvegpu_mappings.prom").read_text().splitlines() if line[0] != "#"]
    assert STAMP.fullmatch(lines[-1]), lines
    return lines[:-1]


def healthy(n: int, bus: str, status: str, value: int) -> str:
    node = os.uname().nodename.split(".")[0]
    return (
        f'pvegpu_mapping_healthy{{mapping="gpu{n}",node="{node}",path="0000:{bus}:00",status="{status}",'
        f'vmid="100"}} {value}'
    )


@pytest.mark.parametrize(
    "case",
    [
        ("reference", ("valid",) * 8),
        # A BIOS renumbering: the hook would repair it at the next start; until then each is `drift`.
        ("reference-renumbered", ("drift",) * 8),
        # gpu3's card is gone: the cards after it may have taken its place (the hook refuses them with it).
        ("reference-missing-gpu", ("valid",) * 3 + ("changed",) * 5),
    ],
)
def test_zipapp_gauges_valid_drift_changed_nothing_printed_or_written_to_proxmox(
    case: tuple[str, tuple[str, ...]],
    zipapp: Path,
    trees: dict[str, Path],
    hw: dict[str, HostHardware],
    tmp_path: Path,
) -> None:
    tree, statuses = case
    done, textfiles = check(zipapp, tmp_path, hw["reference"], trees[tree])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert samples(textfiles) == [
        healthy(n, bus, status, int(status == "valid"))
        for n, (bus, status) in enumerate(zip(BUSES, statuses, strict=True))
    ]
    assert sorted(p.name for p in textfiles.iterdir()) == ["pvegpu_mappings.prom"]  # no temporary file left
    assert not (tmp_path / "bin/calls").exists()  # pvesh never ran


def test_error_zipapp_gauges_unreadable_hardware_one_line_on_stderr_no_file(
    zipapp: Path, hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    """The file keeps the last check's time: the staleness alert sees it (README)."""
    done, textfiles = check(zipapp, tmp_path, hw["reference"], tmp_path / "no-sys")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"pvegpu: VM 100: mappings not checked (hardware command failed (exit 1): pvegpu: sysfs root "
        f"{tmp_path / 'no-sys'} is not a readable directory)\n"
    )
    assert list(textfiles.iterdir()) == []


def test_mapping_health_only_the_vms_prefixed_mappings_in_hostpci_order(hw: dict[str, HostHardware]) -> None:
    """CONFIG maps gpu0 and gpu2..gpu7 (hostpci1 is a raw address, not pvegpu's)."""
    gpus = mapping_health(CHECK, CONFIG, mapped(hw["reference"]), hw["reference"])
    expected = [(n, bus) for n, bus in enumerate(BUSES) if n != 1]
    assert gpus == tuple(MappingHealth(f"gpu{n}", f"0000:{bus}:00", "valid") for n, bus in expected)


def test_mapping_health_a_mapping_missing_from_pci_cfg_is_changed(hw: dict[str, HostHardware]) -> None:
    sections = tuple(m for m in mapped(hw["reference"]) if m.id != "gpu7")
    gpus = mapping_health(CHECK, CONFIG, sections, hw["reference"])
    assert gpus[-1] == MappingHealth("gpu7", "", "changed")


@pytest.mark.parametrize("config", ["boot: order=scsi0\n", "hostpci0: mapping=other0\n"])
def test_mapping_health_of_a_vm_without_prefixed_mappings_is_empty(
    config: str, hw: dict[str, HostHardware]
) -> None:
    assert mapping_health(CHECK, config, mapped(hw["reference"]), hw["reference"]) == ()


def test_error_an_unexpected_failure_is_one_line_on_stderr_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*_: object) -> int:
        raise RuntimeError("a bug\non two lines")

    monkeypatch.setattr(live_gauges_module, "live_gauges", boom)
    assert main(["--gauges", "100"]) == 1
    assert capsys.readouterr() == (
        "",
        "pvegpu: VM 100: the mappings' check failed (RuntimeError: a bug; on two lines); the gauges were not "
        "written\n",
    )
