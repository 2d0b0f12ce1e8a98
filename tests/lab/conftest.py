"""Lab tier fixtures: fresh hosts per test, the real pyinfra CLI against them, and leftover checks.

The tier runs in its own run directory (PVEGPU_LAB_RUN, see `lab_run_dir`), and every test's hosts are
stopped when the test ends.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab import hosts

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).with_name("pyinfra")
TEST_RUNS = Path("/run/pvegpu-lab-tests")
# Host names are unique per session (network namespace and veth names are machine-wide): t<pid>n<k>.
_names = (f"t{os.getpid() % 10000}n{k}" for k in itertools.count(1))

MakeHost = Callable[..., hosts.LabHost]


@contextmanager
def _lab_run(run: Path) -> Iterator[None]:
    previous = os.environ.get("PVEGPU_LAB_RUN")
    os.environ["PVEGPU_LAB_RUN"] = str(run)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PVEGPU_LAB_RUN"]
        else:
            os.environ["PVEGPU_LAB_RUN"] = previous


@pytest.fixture(scope="session", autouse=True)
def lab_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This session's own run directory, <TEST_RUNS>/<pid>: the tier never sees (or stops) the hosts of a
    lab a user started, nor those of a concurrent session. Hosts a killed session left are stopped first."""
    for stale in sorted(TEST_RUNS.glob("*")):
        if stale.name.isdigit() and not Path("/proc", stale.name).exists():
            with _lab_run(stale):
                hosts.down_all()
            shutil.rmtree(stale)
    run = TEST_RUNS / str(os.getpid())
    # The reads pyinfra's runs send ahead (pvegpu/run/early_read.py) stay the tier's own, outside the run
    # directory (every folder there is a host to `python -m lab down --all`).
    with _lab_run(run), pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield run
        hosts.down_all()
    if run.exists():
        shutil.rmtree(run)


@pytest.fixture
def make_host() -> Iterator[MakeHost]:
    """`make_host(topology="reference", mode="netns")` -> a running host, stopped after the test."""
    made: list[str] = []

    def make(topology: str = "reference", mode: hosts.Mode = "netns") -> hosts.LabHost:
        name = next(_names)
        made.append(name)
        return hosts.up(name, topology, mode)

    yield make
    for name in made:
        hosts.down(name)


def _ssh(host: hosts.LabHost, command: str) -> str:
    result = subprocess.run(
        hosts.ssh_argv(host, command), check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"ssh {host.name} {command!r} -> {result.returncode}: {result.stderr}"
    return result.stdout


def _pyinfra(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(PYINFRA), *map(str, args)]
    result = subprocess.run(
        argv, check=False, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600
    )
    if check:
        assert result.returncode == 0, f"pyinfra {args} -> {result.returncode}\n{result.stderr}"
    return result


def _deploy(deploy_file: Path, *targets: hosts.LabHost) -> dict[str, Any]:
    limits = [arg for target in targets for arg in ("--limit", target.name)]
    result = _pyinfra("--json", "-y", *limits, "inventory/lab.py", deploy_file)
    results: dict[str, Any] = json.loads(result.stdout)["results"]
    return results


def _leftovers(host: hosts.LabHost) -> list[str]:
    found = []
    netns = f"net:[{host.netns_inode}]"
    in_netns = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "ns/net") == netns:
                in_netns.append(int(proc.name))
        except OSError:
            continue  # exited, or a zombie
    if host.is_alive() or in_netns:
        found.append(f"processes: top {host.pid} alive={host.is_alive()}, in its netns {in_netns}")
    if Path("/run/netns", hosts.netns_name(host.name)).exists():
        found.append(f"network namespace {hosts.netns_name(host.name)}")
    if Path("/sys/class/net", hosts.netns_name(host.name)).exists():
        found.append(f"veth {hosts.netns_name(host.name)}")
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    mounts = [line for line in mountinfo if str(host.state_dir) in line]
    if mounts:
        found.append(f"mounts: {mounts}")
    if host.state_dir.exists():
        found.append(f"state directory {host.state_dir}")
    if host.address in hosts.known_hosts_path().read_text():
        found.append(f"known_hosts entry for {host.address}")
    return found


@pytest.fixture
def lab_ssh() -> Callable[[hosts.LabHost, str], str]:
    """`lab_ssh(host, command)` -> stdout, over SSH, host key checked strictly; fails on a non-zero exit."""
    return _ssh


@pytest.fixture
def pyinfra_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`pyinfra_cli(*args, check=True)`: the real pyinfra CLI, run from the repository root like README's."""
    return _pyinfra


@pytest.fixture
def lab_deploy() -> Callable[..., dict[str, Any]]:
    """`lab_deploy(deploy_file, *hosts)` -> `results` of `pyinfra --json -y inventory/lab.py DEPLOY`.

    `--json` makes pyinfra print a machine-readable summary on stdout (per operation: the hosts with success,
    error and no_change; totals), so no test scrapes the human results table pyinfra prints on stderr.
    """
    return _deploy


@pytest.fixture
def lab_leftovers() -> Callable[[hosts.LabHost], list[str]]:
    """`lab_leftovers(host)` -> what the host left on this machine: processes (its top process and anything in
    its network namespace), network namespace, veth, mounts, state directory, known_hosts entry."""
    return _leftovers
