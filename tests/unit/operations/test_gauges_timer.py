"""The live gauges' timer (pvegpu/operations/node_exporter.py `gauges_timer`): the exact unit files and
script, the exact commands from the host's one state read (a converged host: none, and nothing read but
that read), and the serving host's script run against SGLang ready, not ready and not listening."""

from __future__ import annotations

import hashlib
import http.server
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.context import ctx_host

from pvegpu.facts.node_read import NodeRead
from pvegpu.models.boot import CpuKernel
from pvegpu.models.exporter import (
    GAUGES_SCRIPT,
    GAUGES_SERVICE_FILE,
    GAUGES_TIMER_FILE,
    NODE_FILE,
    SERVING_FILE,
    TIMER_FILES,
    ExporterState,
)
from pvegpu.models.groups import PVE_NODES, VM_GUESTS
from pvegpu.models.guest_state import MISSING, PathState, UnitState
from pvegpu.models.sglang import ProbeTarget
from pvegpu.models.specs import host_specs
from pvegpu.operations import node_exporter
from pvegpu.operations.files import write_file
from pvegpu.operations.node_exporter import gauges_timer, sglang_script, timer_files
from pvegpu.plan.node import NodeObserved, NodePlan, plan_node
from pvegpu.plan.sglang_service import probe_target
from tests.unit.host_states import host_state
from tests.unit.hostdata import RTX, two_cards
from tests.unit.op_harness import FakeHost, node_state
from tests.unit.operations.test_node_exporter import Guest, Node

SERVICE_VM = """\
# Managed by pvegpu (role node_exporter). VM 100's GPU mappings' health into /var/lib/prometheus/node-exporter/pvegpu_mappings.prom, for the node exporter's
# textfile collector; started by pvegpu-gauges.timer every 30 s.
[Unit]
Description=pvegpu: VM 100's GPU mappings' health into /var/lib/prometheus/node-exporter/pvegpu_mappings.prom

[Service]
Type=oneshot
TimeoutStartSec=60
ExecStart=/usr/bin/python3 /usr/local/lib/pvegpu/pvegpu-hook.pyz --gauges --prefix gpu --owner {owner} --sysfs-root /sys 100
"""  # noqa: E501 - the file's own lines
TIMER = """\
# Managed by pvegpu (role node_exporter). Runs pvegpu-gauges.service 30 s after boot, then 30 s after each
# run: its textfile's checked timestamp says how fresh the gauges are.
[Unit]
Description=pvegpu: refresh pvegpu's live gauges every 30 s

[Timer]
OnBootSec=30s
OnUnitActiveSec=30s
AccuracySec=1s

[Install]
WantedBy=timers.target
"""
RELOAD = "systemctl daemon-reload"
START = "systemctl start pvegpu-gauges.timer"
ENABLE = "systemctl enable pvegpu-gauges.timer"


def plan(group: str, profile: str, vm: dict[str, Any] | None = None) -> NodePlan:
    data: dict[str, Any] = {
        "node": {"name": "llm", "profile": profile, "gpus": {"ids": [RTX], "count": 2}},
        "driver": {"version": "590.48.01"},
    }
    if vm is not None:
        data["vm"] = vm
    observed = NodeObserved(two_cards(), CpuKernel("amd", (6, 8)) if group == PVE_NODES else None)
    return plan_node("llm", host_specs(data), frozenset({group}), observed)


def run(target: FakeHost, *, serving: bool) -> list[str]:
    with ctx_host.use(target):
        return [c.get_raw_value() for c in gauges_timer._inner(serving=serving)]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write(path: str, content: str) -> str:
    return write_file(path, content, mode="0644", owner="root:root").get_raw_value()


@pytest.fixture
def vm_node(monkeypatch: pytest.MonkeyPatch) -> NodePlan:
    node = plan(PVE_NODES, "vm", {"vmid": 100})
    monkeypatch.setattr(node_exporter, "plan_of", lambda _host: node)
    return node


@pytest.fixture
def guest(monkeypatch: pytest.MonkeyPatch) -> NodePlan:
    served = plan(VM_GUESTS, "vm")
    monkeypatch.setattr(node_exporter, "plan_of", lambda _host: served)
    return served


def test_node_timer_files_exact(vm_node: NodePlan) -> None:
    with ctx_host.use(Node({})):
        files = timer_files(serving=False)
    assert files == {
        GAUGES_SERVICE_FILE: SERVICE_VM.format(owner=vm_node.owner),
        GAUGES_TIMER_FILE: TIMER,
    }


@pytest.mark.usefixtures("vm_node")
def test_create_on_a_vm_node_writes_both_units_reloads_starts_enables() -> None:
    fresh = ExporterState(True, True, True, True, dict.fromkeys((NODE_FILE, SERVING_FILE, *TIMER_FILES)))
    node = Node({NodeRead: node_state(exporter=fresh)})
    with ctx_host.use(node):
        files = timer_files(serving=False)
    assert run(node, serving=False) == [
        write(GAUGES_SERVICE_FILE, files[GAUGES_SERVICE_FILE]),
        write(GAUGES_TIMER_FILE, TIMER),
        RELOAD,
        START,
        ENABLE,
    ]


@pytest.mark.usefixtures("vm_node")
def test_noop_converged_vm_node_asks_nothing_but_its_one_read() -> None:
    with ctx_host.use(Node({})):
        files = timer_files(serving=False)
    digests = {path: digest(text) for path, text in files.items()}
    state = ExporterState(True, True, True, True, {GAUGES_SCRIPT: None, **digests}, True, True)
    node = Node({NodeRead: node_state(exporter=state)})
    assert run(node, serving=False) == []
    assert node.noops == [
        f"pvegpu-gauges.timer is running and enabled; {GAUGES_SERVICE_FILE}, {GAUGES_TIMER_FILE} are pvegpu's"
    ]
    assert node.asked == [NodeRead]


@pytest.mark.usefixtures("vm_node")
def test_update_a_stopped_disabled_timer_is_started_and_enabled_no_reload() -> None:
    with ctx_host.use(Node({})):
        files = timer_files(serving=False)
    state = ExporterState(True, True, True, True, {p: digest(t) for p, t in files.items()}, False, False)
    assert run(Node({NodeRead: node_state(exporter=state)}), serving=False) == [START, ENABLE]


def test_noop_a_node_with_self_heal_off_has_no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    node_plan = plan(PVE_NODES, "vm", {"vmid": 100, "self_heal": "off"})
    monkeypatch.setattr(node_exporter, "plan_of", lambda _host: node_plan)
    node = Node({})
    assert run(node, serving=False) == []
    assert node.noops == [
        "no pvegpu-gauges.timer here: no pre-start hook on this node (vm.self_heal off, or no VM)"
    ]
    assert node.asked == []


@pytest.mark.usefixtures("vm_node")
def test_noop_without_systemd_the_timer_is_left_alone() -> None:
    bare = ExporterState(True, False, False, False, dict.fromkeys((NODE_FILE, SERVING_FILE, *TIMER_FILES)))
    node = Node({NodeRead: node_state(exporter=bare)})
    assert run(node, serving=False) == []
    assert node.noops == ["no systemd on this host: pvegpu-gauges.timer is not started"]


def serving_state(
    files: dict[str, str | None], *, running: bool, enabled: bool, service_needs_reload: bool = False
) -> object:
    return host_state(
        units={
            "pvegpu-gauges.timer": UnitState(running=running, enabled=enabled),
            "pvegpu-gauges.service": UnitState(
                running=False, enabled=False, needs_reload=service_needs_reload
            ),
        },
        paths={
            path: MISSING if sha is None else PathState("file", "644", "root", "root", sha)
            for path, sha in files.items()
        },
    )


def test_serving_host_files_exact_service_and_the_probe_script(guest: NodePlan) -> None:
    with ctx_host.use(Guest({})):
        files = timer_files(serving=True)
    assert list(files) == [GAUGES_SCRIPT, GAUGES_SERVICE_FILE, GAUGES_TIMER_FILE]
    assert files[GAUGES_SCRIPT] == sglang_script(probe_target(guest.specs.sglang))
    assert files[GAUGES_SERVICE_FILE].splitlines()[3:] == [
        "Description=pvegpu: SGLang's readiness into /var/lib/prometheus/node-exporter/pvegpu_sglang.prom",
        "",
        "[Service]",
        "Type=oneshot",
        "TimeoutStartSec=60",
        "ExecStart=/bin/sh /usr/local/sbin/pvegpu-sglang-gauges",
    ]


@pytest.mark.usefixtures("guest")
def test_create_on_a_serving_host_from_its_state_read(monkeypatch: pytest.MonkeyPatch) -> None:
    state = serving_state(dict.fromkeys(TIMER_FILES), running=False, enabled=False)
    monkeypatch.setattr("pvegpu.run.exporter.state_of", lambda _host: state)
    target = Guest({})
    with ctx_host.use(target):
        files = timer_files(serving=True)
    assert run(target, serving=True) == [*(write(p, t) for p, t in files.items()), RELOAD, START, ENABLE]


@pytest.mark.usefixtures("guest")
def test_update_only_the_script_changed_no_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    with ctx_host.use(Guest({})):
        files = timer_files(serving=True)
    shas: dict[str, str | None] = {p: digest(t) for p, t in files.items()}
    shas[GAUGES_SCRIPT] = "0" * 64
    state = serving_state(shas, running=True, enabled=True)
    monkeypatch.setattr("pvegpu.run.exporter.state_of", lambda _host: state)
    assert run(Guest({}), serving=True) == [write(GAUGES_SCRIPT, files[GAUGES_SCRIPT])]


@pytest.mark.usefixtures("guest")
def test_noop_converged_serving_host(monkeypatch: pytest.MonkeyPatch) -> None:
    with ctx_host.use(Guest({})):
        files = timer_files(serving=True)
    state = serving_state({p: digest(t) for p, t in files.items()}, running=True, enabled=True)
    monkeypatch.setattr("pvegpu.run.exporter.state_of", lambda _host: state)
    target = Guest({})
    assert run(target, serving=True) == []
    assert target.noops == [f"pvegpu-gauges.timer is running and enabled; {', '.join(files)} are pvegpu's"]


@pytest.mark.usefixtures("guest")
def test_a_unit_file_newer_than_systemd_loaded_is_reloaded_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that wrote the service's file and stopped before reloading: the files match, the timer runs, but
    systemd still has the old service (NeedDaemonReload=yes): the next run reloads the units, once."""
    with ctx_host.use(Guest({})):
        files = timer_files(serving=True)
    shas: dict[str, str | None] = {p: digest(t) for p, t in files.items()}
    state = serving_state(shas, running=True, enabled=True, service_needs_reload=True)
    monkeypatch.setattr("pvegpu.run.exporter.state_of", lambda _host: state)
    target = Guest({})
    assert run(target, serving=True) == [RELOAD]
    assert target.noops == []


@pytest.mark.usefixtures("vm_node")
def test_a_node_whose_timer_needs_a_reload_gets_one() -> None:
    with ctx_host.use(Node({})):
        files = timer_files(serving=False)
    digests = {path: digest(text) for path, text in files.items()}
    state = ExporterState(True, True, True, True, {GAUGES_SCRIPT: None, **digests}, True, True, True)
    assert run(Node({NodeRead: node_state(exporter=state)}), serving=False) == [RELOAD]


# --- the serving host's script, run ------------------------------------------------------------------------


class Sglang(http.server.BaseHTTPRequestHandler):
    """SGLang's /health and /v1/models; /health answers `status` (the server's attribute)."""

    def do_GET(self) -> None:
        status = getattr(self.server, "status", 200)
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = b'{"data": [{"id": "glm-5"}]}'
        else:
            status, body = 404, b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        return


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Sglang)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


HELP = (
    "# HELP pvegpu_sglang_ready 1: SGLang answered /health and /v1/models at the gauges timer's last check\n"
    "# TYPE pvegpu_sglang_ready gauge\n"
    "pvegpu_sglang_ready {ready}\n"
    "# HELP pvegpu_sglang_ready_checked_timestamp_seconds When the gauges timer last probed SGLang (Unix "
    "time)\n"
    "# TYPE pvegpu_sglang_ready_checked_timestamp_seconds gauge\n"
    "pvegpu_sglang_ready_checked_timestamp_seconds T\n"
)


def run_script(tmp_path: Path, port: int) -> tuple[subprocess.CompletedProcess[str], str]:
    """The script for SGLang at 127.0.0.1:`port` writing into `tmp_path`: (the run, its file, time -> T)."""
    textfile = tmp_path / "pvegpu_sglang.prom"
    target = ProbeTarget(sys.executable, f"http://127.0.0.1:{port}", None)
    script = tmp_path / "pvegpu-sglang-gauges"
    script.write_text(sglang_script(target, str(textfile)))
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=False, timeout=60)
    text = textfile.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pvegpu-sglang-gauges", "pvegpu_sglang.prom"]
    stamp = re.search(r"_seconds ([0-9]{10})\n\Z", text)
    assert stamp is not None, text
    return done, text[: stamp.start(1)] + "T\n"


def test_script_ready(server: http.server.HTTPServer, tmp_path: Path) -> None:
    done, text = run_script(tmp_path, server.server_address[1])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert text == HELP.format(ready=1)


def test_script_not_ready_health_503(server: http.server.HTTPServer, tmp_path: Path) -> None:
    server.status = 503  # type: ignore[attr-defined]
    done, text = run_script(tmp_path, server.server_address[1])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert text == HELP.format(ready=0)


def test_script_connection_refused(server: http.server.HTTPServer, tmp_path: Path) -> None:
    port = server.server_address[1]
    server.shutdown()
    server.server_close()  # nothing listens on the port now
    done, text = run_script(tmp_path, port)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert text == HELP.format(ready=0)


def test_error_script_cannot_write_says_so_and_fails(tmp_path: Path) -> None:
    target = ProbeTarget(sys.executable, "http://127.0.0.1:1", None)
    textfile = tmp_path / "missing-dir" / "pvegpu_sglang.prom"
    done = subprocess.run(
        ["sh", "-c", sglang_script(target, str(textfile))],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"pvegpu: could not write {textfile}"
