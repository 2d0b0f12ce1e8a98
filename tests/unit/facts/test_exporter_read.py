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
NODE_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # an empty file


def test_lab_node_sample_installed_running_enabled_with_its_node_file_and_timer() -> None:
    assert parse_exporter(SAMPLE) == ExporterState(
        installed=True,
        running=True,
        enabled=True,
        systemd=True,
        files={NODE_FILE: NODE_SHA256, SERVING_FILE: None},
        timer_running=True,
        timer_enabled=True,
        timer_needs_reload=False,
    )


def test_not_installed_without_systemd() -> None:
    # SOURCE: synthesized: a lab `netns` host (no systemd: `systemctl show` prints nothing) where dpkg knows
    # the package only as not installed (`un`), as dpkg-query -W prints it then.
    lines = ["package\tun \t", f"file\t{NODE_FILE}"]
    assert parse_exporter(lines) == ExporterState(False, False, False, False, {NODE_FILE: None})


def test_the_exporter_stopped_and_the_gauges_timer_waiting_with_its_unit_files() -> None:
    # SOURCE: the lab capture above with the exporter's unit stopped and disabled (`systemctl disable --now
    # prometheus-node-exporter` on the same node: SubState=dead, UnitFileState=disabled).
    service = "/etc/systemd/system/pvegpu-gauges.service"
    assert SAMPLE[3:5] == ("unit\tSubState=running", "unit\tUnitFileState=enabled")
    stopped = [*SAMPLE[:3], "unit\tSubState=dead", "unit\tUnitFileState=disabled", *SAMPLE[5:16]]
    lines = [*stopped, f"file\t{service}", f"{NODE_SHA256}  {service}"]
    expected = ExporterState(True, False, False, True, {service: NODE_SHA256}, True, True)
    assert parse_exporter(lines) == expected


def test_error_an_unknown_unit_property() -> None:
    with pytest.raises(FactParseError, match=r"exporter: unexpected line 'unit.tActiveState=active'"):
        parse_exporter(["unit\tActiveState=active"])


# SOURCE: captured 2026-12-07 on a lab nspawn host (Debian 12, systemd 252.39-1~deb12u2), the timer enabled
# and started, then `touch /etc/systemd/system/pvegpu-gauges.service` (as a run that wrote it and stopped
# before `systemctl daemon-reload` leaves it): the timer's and its service's blocks of systemctl's output.
TIMER_AND_STALE_SERVICE = [
    "unit\tId=pvegpu-gauges.timer",
    "unit\tSubState=waiting",
    "unit\tUnitFileState=enabled",
    "unit\tNeedDaemonReload=no",
    "unit\t",
    "unit\tId=pvegpu-gauges.service",
    "unit\tSubState=dead",
    "unit\tUnitFileState=static",
    "unit\tNeedDaemonReload=yes",
]


def test_the_timer_runs_and_its_service_file_is_newer_than_systemd_loaded() -> None:
    state = parse_exporter(["systemd", *TIMER_AND_STALE_SERVICE])
    assert (state.timer_running, state.timer_enabled, state.timer_needs_reload) == (True, True, True)


def test_the_timer_block_is_the_one_named_so_and_a_reload_needed_by_either() -> None:
    service_first = [*TIMER_AND_STALE_SERVICE[5:], "unit\t", *TIMER_AND_STALE_SERVICE[:4]]
    reloaded = [line.replace("NeedDaemonReload=yes", "NeedDaemonReload=no") for line in service_first]
    assert parse_exporter(service_first) == parse_exporter(TIMER_AND_STALE_SERVICE)
    assert parse_exporter(reloaded).timer_needs_reload is False
    assert parse_exporter(reloaded).timer_running is True


def test_no_such_units_neither_run_nor_need_a_reload() -> None:
    # SOURCE: captured 2026-12-07 on the same host: `systemctl show ... nosuch.timer nosuch.service`.
    lines = [
        *("unit\tId=nosuch.service", "unit\tSubState=dead", "unit\tUnitFileState="),
        *("unit\tNeedDaemonReload=no", "unit\t"),
        *("unit\tId=nosuch.timer", "unit\tSubState=dead", "unit\tUnitFileState="),
        *("unit\tNeedDaemonReload=no", "unit\t"),
        *("unit\tId=nosuch.service", "unit\tSubState=dead", "unit\tUnitFileState="),
        "unit\tNeedDaemonReload=no",
    ]
    assert parse_exporter(["systemd", *lines]) == ExporterState(False, False, False, True, {})


def test_the_exporter_is_the_block_systemctl_names_otherwise_even_after_the_gauges_units() -> None:
    # The exporter's unit is read by whatever Id systemd gives it (an alias shows the unit it points to).
    blocks = "\n".join(SAMPLE[2:16]).split("\nunit\t\n")
    aliased = blocks[0].replace("prometheus-node-exporter", "alias")
    reordered = "\nunit\t\n".join([blocks[1], blocks[2], aliased])
    assert parse_exporter([*SAMPLE[:2], *reordered.split("\n"), *SAMPLE[16:]]) == parse_exporter(SAMPLE)


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
