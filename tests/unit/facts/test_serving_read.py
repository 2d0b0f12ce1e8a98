"""A serving host's one read (pvegpu/facts/serving_read.py): run here with sh on a generated sysfs tree, each
half equals its own fact's answer; a failing hardware listing fails the read; other output is refused."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from lab import fakesys
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.hardware import PciHardware
from pvegpu.facts.host_read import HostRead, StateRequest
from pvegpu.facts.serving_read import STATE_MARKER, ServingRead, parse_serving_read, serving_read_command
from pvegpu.models.sglang import ProbeTarget


def run(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)


def test_one_command_gives_what_the_two_facts_give(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    fakesys.write_tree(sysfs, "reference")
    (tmp_path / "a.conf").write_text("x\n")
    target = ProbeTarget(str(tmp_path / "no-venv/bin/python"), "http://127.0.0.1:9", None)
    request = StateRequest(paths=(str(tmp_path / "a.conf"),), users=("root",), probe=target)
    fact = ServingRead()
    done = run(fact.command(str(sysfs), request))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1  # packed: pyinfra reads one line, not a thousand
    read = fact.process(done.stdout.splitlines())

    assert read.hardware == PciHardware().process(run(PciHardware().command(str(sysfs))).stdout.splitlines())
    alone = HostRead()
    state = alone.process(run(alone.command(request)).stdout.splitlines())
    # Equal but for the shell's own line numbers in "not found" messages (`sh: 38: ...`).
    assert replace(read.state, smi=state.smi, probe=state.probe) == state
    assert read.state.smi.error is not None
    assert re.fullmatch(r"sh: \d+: nvidia-smi: not found", read.state.smi.error)
    assert read.state.probe is not None
    assert not read.state.probe.ok
    assert read.state.probe.detail.endswith("no-venv/bin/python: not found")
    assert read.state.probe_target == target  # the probe's verdict, with what it probed
    assert len([f for f in read.hardware.functions if f.vendor == "10de"]) == 16


def test_a_failing_listing_fails_the_read(tmp_path: Path) -> None:
    done = run(serving_read_command(str(tmp_path / "nowhere"), StateRequest()))
    assert done.returncode == 1
    assert done.stderr == f"pvegpu: sysfs root {tmp_path}/nowhere is not a readable directory\n"
    assert STATE_MARKER not in done.stdout


def test_unpacked_output_is_refused() -> None:
    with pytest.raises(FactParseError) as error:
        ServingRead().process(["#pvegpu:os", "ID=debian"])
    assert str(error.value) == "serving read: not one line of gzip in base64 (2 lines)"


def test_output_without_the_marker_is_refused() -> None:
    with pytest.raises(FactParseError) as error:
        parse_serving_read(["#pvegpu:os", "ID=debian"])
    assert str(error.value) == "serving read: truncated output, the #pvegpu-serving:state marker is missing"
