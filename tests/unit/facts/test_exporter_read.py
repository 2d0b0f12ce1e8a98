"""The node exporter's part of a host's state read (pvegpu/facts/exporter_read.py): a real capture from a lab
node, the command run here, the node read with and without the part, and the parser's refusals."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.exporter_read import ExporterRead, exporter_command, parse_exporter
from pvegpu.facts.node_read import PART_MARKER, NodeStateRequest, node_read_command, parse_node_state
from pvegpu.models.exporter import EXPORTER_PACKAGE, EXPORTER_SERVICE, NODE_FILE, SERVING_FILE, ExporterState
from tests.unit.fuzz_targets import fixture

SAMPLE = fixture("exporter_read_lab_node.txt")
NODE_SHA256 = "7a6d7c7d0959bae46fb6121e978f70236b595f44b33ff551ef49bbf000e70025"


def test_lab_node_sample_installed_running_enabled_with_its_node_file() -> None:
    assert parse_exporter(SAMPLE) == ExporterState(
        installed=True,
        running=True,
        enabled=True,
        systemd=True,
        files={NODE_FILE: NODE_SHA256, SERVING_FILE: None},
    )


def test_not_installed_without_systemd() -> None:
    # SOURCE: synthesized: a lab `netns` host (no systemd: `systemctl show` prints nothing) where dpkg knows
    # the package only as not installed (`un`), as dpkg-query -W prints it then.
    lines = ["package\tun \t", f"file\t{NODE_FILE}"]
    assert parse_exporter(lines) == ExporterState(False, False, False, False, {NODE_FILE: None})


def test_the_gauges_timer_waiting_and_enabled_and_its_unit_files() -> None:
    # SOURCE: synthesized from `systemctl show --property SubState --property UnitFileState
    # pvegpu-gauges.timer` on Debian 12 for an enabled timer between two runs of its service (`waiting`).
    service = "/etc/systemd/system/pvegpu-gauges.service"
    lines = [
        "systemd",
        "unit\tSubState=running",
        "unit\tUnitFileState=enabled",
        "timer\tSubState=waiting",
        "timer\tUnitFileState=enabled",
        f"file\t{service}",
        f"{NODE_SHA256}  {service}",
    ]
    assert parse_exporter(lines) == ExporterState(False, True, True, True, {service: NODE_SHA256}, True, True)


def test_error_an_unknown_timer_property() -> None:
    with pytest.raises(FactParseError, match=r"exporter: unexpected line 'timer.tActiveState=active'"):
        parse_exporter(["timer\tActiveState=active"])


# SOURCE: captured 2026-12-07 on a lab nspawn host (Debian 12, systemd 252.39-1~deb12u2), the timer enabled
# and started, then `touch /etc/systemd/system/pvegpu-gauges.service` (as a run that wrote it and stopped
# before `systemctl daemon-reload` leaves it): exporter_command's timer line.
TIMER_AND_STALE_SERVICE = [
    "timer\tId=pvegpu-gauges.timer",
    "timer\tSubState=waiting",
    "timer\tUnitFileState=enabled",
    "timer\tNeedDaemonReload=no",
    "timer\t",
    "timer\tId=pvegpu-gauges.service",
    "timer\tSubState=dead",
    "timer\tUnitFileState=static",
    "timer\tNeedDaemonReload=yes",
]


def test_the_timer_runs_and_its_service_file_is_newer_than_systemd_loaded() -> None:
    state = parse_exporter(["systemd", *TIMER_AND_STALE_SERVICE])
    assert (state.timer_running, state.timer_enabled, state.timer_needs_reload) == (True, True, True)


def test_the_timer_block_is_the_one_named_so_and_a_reload_needed_by_either() -> None:
    service_first = [*TIMER_AND_STALE_SERVICE[5:], "timer\t", *TIMER_AND_STALE_SERVICE[:4]]
    reloaded = [line.replace("NeedDaemonReload=yes", "NeedDaemonReload=no") for line in service_first]
    assert parse_exporter(service_first) == parse_exporter(TIMER_AND_STALE_SERVICE)
    assert parse_exporter(reloaded).timer_needs_reload is False
    assert parse_exporter(reloaded).timer_running is True


def test_no_such_units_neither_run_nor_need_a_reload() -> None:
    # SOURCE: captured 2026-12-07 on the same host: `systemctl show ... nosuch.timer nosuch.service`.
    lines = [
        *("timer\tId=nosuch.timer", "timer\tSubState=dead", "timer\tUnitFileState="),
        *("timer\tNeedDaemonReload=no", "timer\t"),
        *("timer\tId=nosuch.service", "timer\tSubState=dead", "timer\tUnitFileState="),
        "timer\tNeedDaemonReload=no",
    ]
    assert parse_exporter(lines) == ExporterState(False, False, False, False, {})


def test_a_unit_systemd_does_not_know_is_neither_running_nor_enabled() -> None:
    # SOURCE: synthesized from `systemctl show --property SubState --property UnitFileState nosuch.service`
    # on Debian 12 (SubState=dead, an empty UnitFileState), and a blank line between units.
    lines = ["systemd", "unit\tSubState=dead", "unit\tUnitFileState=", "unit\t"]
    assert parse_exporter(lines) == ExporterState(False, False, False, True, {})


def test_the_command_here_lists_each_file_and_hashes_those_that_exist(tmp_path: Path) -> None:
    present, absent = tmp_path / "pvegpu_node.prom", tmp_path / "pvegpu_serving.prom"
    present.write_text("pvegpu_sglang_ready 1\n")
    command = ExporterRead().command(EXPORTER_PACKAGE, EXPORTER_SERVICE, (str(present), str(absent)))
    assert command == exporter_command(EXPORTER_PACKAGE, EXPORTER_SERVICE, (str(present), str(absent)))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert parse_exporter(done.stdout.splitlines()).files == {
        str(present): hashlib.sha256(b"pvegpu_sglang_ready 1\n").hexdigest(),
        str(absent): None,
    }


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("unit\tActiveState=active", "exporter: unexpected line 'unit\\tActiveState=active'"),
        (f"{'a' * 64}  /etc/other", f"exporter: unexpected line '{'a' * 64}  /etc/other'"),
        ("systemd running", "exporter: unexpected line 'systemd running'"),
    ],
)
def test_error_another_line(line: str, message: str) -> None:
    with pytest.raises(FactParseError) as raised:
        parse_exporter([line])
    assert str(raised.value) == message


def test_the_node_read_has_the_part_only_when_it_names_textfiles() -> None:
    marker = f"echo '{PART_MARKER}exporter'"
    assert marker not in node_read_command(NodeStateRequest())
    with_files = node_read_command(NodeStateRequest(exporter_files=(NODE_FILE, SERVING_FILE)))
    assert marker in with_files
    assert exporter_command(EXPORTER_PACKAGE, EXPORTER_SERVICE, (NODE_FILE, SERVING_FILE)) in with_files


def test_the_node_reads_lab_sample_with_the_part() -> None:
    node = list(fixture("node_state_lab_node.txt"))
    without = parse_node_state(node)
    end = node.index(f"{PART_MARKER}end")
    state = parse_node_state([*node[:end], f"{PART_MARKER}exporter", *SAMPLE, *node[end:]])
    assert (without.exporter, state.exporter) == (None, parse_exporter(SAMPLE))
    assert state.exporter is not None
    assert state.exporter.sha256(NODE_FILE) == NODE_SHA256
    with pytest.raises(KeyError, match="/etc/x is not in the host's state read"):
        state.exporter.sha256("/etc/x")
