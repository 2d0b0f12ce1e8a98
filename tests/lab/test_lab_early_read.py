"""The state read sent ahead (pvegpu/run/early_read.py) through pyinfra's real CLI over real SSH: a lab node's
first `deploy/host.py` stores its read, the next sends it as pyinfra connects and runs nothing else on the
node, and a stored read that is not the run's first command is dropped, the run's outcome unchanged."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import boot, hosts

pytestmark = pytest.mark.lab

INVENTORY = "tests/lab/inventories/host_role.py"
DEPLOY = "deploy/host.py"

MakeHost = Callable[..., hosts.LabHost]
PyinfraCli = Callable[..., subprocess.CompletedProcess[str]]


def _run(cli: PyinfraCli, node: hosts.LabHost) -> tuple[str, str, int]:
    """(its debug log, the changed column of its summary, how many commands pyinfra ran on `node`) of one
    run."""
    log = cli("-y", "--debug-all", "--limit", node.name, INVENTORY, DEPLOY).stderr
    (changed,) = re.findall(r"^\s*Grand total\s+\S+\s+(\S+)", log, re.M)
    return log, changed, log.count(f"Running command on {node.name}: ")


def _ran(node: hosts.LabHost, command: str) -> str:
    return f"Running command on {node.name}: (pty=False) {command}\n"


def _cache() -> Path:
    return Path(os.environ["XDG_CACHE_HOME"]) / "pvegpu" / "early-reads.json"


def test_the_node_read_is_stored_sent_ahead_then_dropped_when_another(
    make_host: MakeHost, pyinfra_cli: PyinfraCli
) -> None:
    node = make_host("reference", "netns")
    boot.install(node, "grub")
    _cache().unlink(missing_ok=True)

    first, changed, commands = _run(pyinfra_cli, node)
    assert "ahead" not in first
    assert changed != "-"  # the kernel command line and vfio written
    ((key, read),) = json.loads(_cache().read_text()).items()
    assert read.startswith("sh -c 'echo '\"'\"'#pvegpu-node:hardware'\"'\"'")  # the node's state read...
    assert first.index(_ran(node, read)) == first.index(f"Running command on {node.name}: ")  # ...its first
    assert commands > 1

    second, changed, commands = _run(pyinfra_cli, node)
    assert (changed, commands) == ("-", 1)  # nothing changed, and only the read ran: the one sent ahead
    assert _ran(node, read) in second
    assert f"Sent the last run's state read ahead on {node.name}: {read}\n" in second
    assert "Dropped" not in second

    _cache().write_text(json.dumps({key: "sh -c 'echo stale'"}))
    third, changed, commands = _run(pyinfra_cli, node)
    assert f"Sent the last run's state read ahead on {node.name}: sh -c 'echo stale'\n" in third
    assert f"Dropped the read sent ahead on {node.name}: the run's first command is another\n" in third
    assert (changed, commands) == ("-", 1)
    assert _ran(node, read) in third
    assert json.loads(_cache().read_text()) == {key: read}
