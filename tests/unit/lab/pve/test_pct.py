"""The container side of the lab's Proxmox stand-ins, run as programs against a temporary node root and a
fake lab hypervisor (a thread answering the request files as lab/pve/hypervisor.py does): a CT start asks
for the container host with its devN entries, a refusal fails the task, stop asks to stop it; `pct exec`
(lab/pve/pct.py) asks to run a command and relays it, and refuses as pve-container's pct does
(src/PVE/CLI/pct.pm, PVE::AbstractConfig::load_config) or as lxc-attach does for a stopped container."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[4]
NODE = "pve1"
UPID = re.compile(r'"UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:vzstart:200:root@pam:"\n')


@dataclass
class Node:
    base: Path
    requests: list[dict[str, Any]] = field(default_factory=list)
    answer: dict[str, Any] = field(default_factory=lambda: {"ok": True, "pid": 1, "guest": "pve1c200"})

    @property
    def root(self) -> Path:
        return self.base / "root"

    def __call__(self, program: str, *args: str) -> tuple[int, str, str]:
        env = {"PVEGPU_LAB_PVE_CONFIG": str(self.base / "pve.json"), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, str(REPO / f"lab/pve/{program}.py"), *args],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        return done.returncode, done.stdout, done.stderr


def _serve(node: Node, stop: threading.Event) -> None:
    folder = node.base / "hv"
    while not stop.wait(0.02):
        for path in sorted(folder.glob("*.request")):
            request = json.loads(path.read_text())
            node.requests.append(request)
            path.with_suffix(".partial").write_text(json.dumps(node.answer))
            path.unlink()
            path.with_suffix(".partial").rename(path.with_suffix(".answer"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(tmp_path)
    (tmp_path / "hv").mkdir()
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    settings = {
        "node": NODE,
        "sysfs_root": str(tmp_path / "sys"),
        "root": str(made.root),
        "hypervisor_dir": str(tmp_path / "hv"),
        "hypervisor_timeout_s": 20,
    }
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    stop = threading.Event()
    thread = threading.Thread(target=_serve, args=(made, stop), daemon=True)
    thread.start()
    yield made
    stop.set()
    thread.join()


def create_ct(node: Node) -> None:
    """CT 200 with two devN entries; their nodes exist on the node (char devices need root)."""
    if os.geteuid() != 0:
        pytest.skip("devN entries must name real device nodes: mknod needs root")
    (node.root / "dev").mkdir(parents=True)
    for name, minor in (("nvidia0", 0), ("nvidiactl", 255)):
        os.mknod(node.root / "dev" / name, stat.S_IFCHR | 0o666, os.makedev(195, minor))
    rc, _, err = node(
        "pvesh", "create", f"/nodes/{NODE}/lxc", "--vmid", "200", "--ostemplate", "local:vztmpl/d.tar.zst",
        "--dev0", "/dev/nvidia0,gid=44", "--dev1", "path=/dev/nvidiactl,mode=0660,uid=0",
    )  # fmt: skip
    assert (rc, err) == (0, "")


def status(node: Node) -> str:
    rc, out, _ = node("pvesh", "get", f"/nodes/{NODE}/lxc/200/status/current", "--output-format", "json")
    assert rc == 0
    value: str = json.loads(out)["status"]
    return value


def test_ct_start_asks_for_the_container_host_with_its_devices_and_stop_stops_it(node: Node) -> None:
    create_ct(node)

    start = node("pvesh", "create", f"/nodes/{NODE}/lxc/200/status/start")
    running = status(node)
    stop = node("pvesh", "create", f"/nodes/{NODE}/lxc/200/status/stop")

    assert (start[0], start[2], stop[0], stop[2]) == (0, "", 0, "")
    assert (running, status(node)) == ("running", "stopped")
    assert node.requests == [
        {
            "action": "start",
            "type": "lxc",
            "vmid": 200,
            "dev": [
                {"path": "/dev/nvidia0", "gid": "44"},
                {"path": "/dev/nvidiactl", "mode": "0660", "uid": "0"},
            ],
            "mp": [],
        },
        {"action": "stop", "type": "lxc", "vmid": 200},
    ]


def test_ct_shutdown_ends_it_and_a_stopped_one_is_refused(node: Node) -> None:
    create_ct(node)
    assert node("pvesh", "create", f"/nodes/{NODE}/lxc/200/status/start")[2] == ""

    shutdown = node("pvesh", "create", f"/nodes/{NODE}/lxc/200/status/shutdown", "--timeout", "30")
    again = node("pvesh", "create", f"/nodes/{NODE}/lxc/200/status/shutdown")

    assert (shutdown[0], shutdown[2]) == (0, "")
    assert ":vzshutdown:200:" in shutdown[1]
    assert status(node) == "stopped"
    assert node.requests[-1] == {"action": "stop", "type": "lxc", "vmid": 200}
    assert (again[0], again[2]) == (255, "CT 200 not running\n")


def test_error_ct_start_refused_by_the_hypervisor_fails_the_task(node: Node) -> None:
    create_ct(node)
    node.answer = {"ok": False, "error": "lab host pve1c200 did not come up"}

    rc, out, err = node("pvesh", "create", f"/nodes/{NODE}/lxc/200/status/start")

    assert (rc, err) == (0, "start failed: lab host pve1c200 did not come up\n")
    assert UPID.fullmatch(out), out
    assert status(node) == "stopped"


def test_pct_exec_relays_the_command_its_output_and_status(node: Node) -> None:
    create_ct(node)
    assert node("pvesh", "create", f"/nodes/{NODE}/lxc/200/status/start")[2] == ""
    node.answer = {"ok": True, "status": 3, "stdout": "out\n", "stderr": "err\n"}

    result = node("pct", "exec", "200", "--", "sh", "-c", "echo out; echo err >&2; exit 3")

    assert result == (3, "out\n", "err\n")
    assert node.requests[-1] == {
        "action": "exec",
        "type": "lxc",
        "vmid": 200,
        "argv": ["sh", "-c", "echo out; echo err >&2; exit 3"],
        "timeout_s": 10.0,
    }


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["exec", "201", "--", "true"],
            (255, "", "Configuration file 'nodes/pve1/lxc/201.conf' does not exist\n"),
        ),
        (["exec", "200", "--"], (255, "", "missing command\n")),
        (
            ["exec", "200", "--", "true"],
            (1, "", "lxc-attach: 200: attach.c: lxc_attach: 1314 Failed to get init pid\n"),
        ),
        (
            ["exec", "20", "true"],
            (
                255,
                "",
                "400 Parameter verification failed.\nvmid: value does not look like a valid VM ID\n"
                "USAGE: pct exec <vmid> [<extra-args>] (pvegpu lab STAND-IN: only `pct exec` is modelled)\n",
            ),
        ),
        (
            ["list"],
            (
                1,
                "",
                "USAGE: pct exec <vmid> [<extra-args>] (pvegpu lab STAND-IN: only `pct exec` is modelled)\n",
            ),
        ),
    ],
    ids=["no-config", "no-command", "not-running", "bad-vmid", "other-command"],
)
def test_error_pct_refuses_like_pct_and_lxc_attach(
    node: Node, argv: list[str], expected: tuple[int, str, str]
) -> None:
    create_ct(node)  # created, not started

    assert node("pct", *argv) == expected
    assert node.requests == []
