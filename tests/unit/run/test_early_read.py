"""pvegpu.run.early_read over a real SSH connection (a loopback paramiko server that runs what it is sent,
tests/unit/loopback_ssh.py) with pyinfra's own SSH connector and fact path, as group_data/all.py sets it up:
the first run stores its state read, the next sends it at connect and takes its answer when its first command
is the same, and anything else drops it."""

from __future__ import annotations

import json
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from pyinfra.api.config import Config
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.server import Command

from pvegpu.run.early_read import (
    KEPT,
    cache_path,
    deploy_key,
    note_deploy,
    pyinfra_transport,
    recording,
    store_read,
)
from tests.unit.loopback_ssh import Server, loopback_sshd

NAME = "127.0.0.1"
DEPLOY = ("deploy/site.py",)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with loopback_sshd(tmp_path) as server:
        yield server


_CONNECTED: list[Host] = []


@pytest.fixture(autouse=True)
def disconnect() -> Iterator[None]:
    """Close each run's connection after the test (paramiko joins open transports' threads at exit)."""
    yield
    while _CONNECTED:
        _CONNECTED.pop().disconnect()


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "pvegpu" / "early-reads.json"


class Run:
    """One pyinfra run's state and host, connected to `server` as the CLI connects (the deploy noted while the
    group data loads, then `host.connect`)."""

    def __init__(
        self, server: Server, deploy: tuple[str, ...] = DEPLOY, data: dict[str, str] | None = None
    ) -> None:
        inventory = Inventory(  # type: ignore[no-untyped-call]
            (
                [NAME],
                {
                    **server.host_data(),
                    "ssh_paramiko_connect_kwargs": {"transport_factory": pyinfra_transport},
                    **(data or {}),
                },
            )
        )
        self.state = State(inventory, Config())  # type: ignore[no-untyped-call]
        self.host: Host = inventory.get_host(NAME)
        with ctx_state.use(self.state), click.Context(click.Command("pyinfra")) as context:
            context.params["operations"] = deploy
            note_deploy()
            self.host.connect(raise_exceptions=True)
        _CONNECTED.append(self.host)

    def state_read(self, command: str) -> str:
        """pvegpu's state read as node_state/host_state make it: a fact, recorded."""
        with ctx_state.use(self.state), ctx_host.use(self.host), recording(self.host):
            return str(self.host.get_fact(Command, command=command))

    def other(self, command: str) -> str:
        """Any other command (an operation's, another fact)."""
        with ctx_state.use(self.state), ctx_host.use(self.host):
            return str(self.host.get_fact(Command, command=command))


def raw(command: str) -> str:
    """What pyinfra's SSH connector sends for a fact's `command` (its default shell)."""
    return f"sh -c '{command}'"


def test_first_run_stores_its_read_the_next_sends_it_at_connect_and_takes_its_answer(
    server: Server, cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen = tmp_path / "seen"
    seen.write_text("at the first run\n")
    read = f"cat {seen}"

    first = Run(server)
    assert server.commands == []  # nothing stored yet: nothing sent at connect
    assert first.state_read(read) == "at the first run"
    assert server.commands == [raw(read)]
    assert json.loads(cache.read_text()) == {deploy_key(first.state, NAME): raw(read)}
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700

    seen.write_text("when the second run connected\n")
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        second = Run(server)
    assert server.commands == [raw(read)] * 2  # sent as it connected, before any deploy code asked
    assert f"Sent the last run's state read ahead on {NAME}: {raw(read)}" in caplog.messages
    server.wait_finished(2)
    seen.write_text("after it connected\n")
    # The answer is the one the host gave when the run connected, and nothing more ran on the host.
    assert second.state_read(read) == "when the second run connected"
    assert server.commands == [raw(read)] * 2
    assert second.state_read(read) == "after it connected"  # a later read runs, as without early reads
    assert server.commands == [raw(read)] * 3


def test_another_first_command_drops_what_was_sent_and_a_later_identical_read_runs_again(
    server: Server, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Run(server).state_read("echo state")
    run = Run(server)
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        assert run.other("echo operation") == "operation"
    assert f"Dropped the read sent ahead on {NAME}: the run's first command is another" in caplog.messages
    # Sent by the first run, sent ahead by the second, the other command, then the read itself again: the
    # answer sent ahead is never taken once another command ran on the host before it.
    assert run.state_read("echo state") == "state"
    assert server.commands == [raw("echo state"), raw("echo state"), raw("echo operation"), raw("echo state")]
    assert json.loads(cache.read_text()) == {deploy_key(run.state, NAME): raw("echo state")}  # not the first


def test_a_changed_read_drops_the_old_one_and_is_stored_for_the_next_run(server: Server, cache: Path) -> None:
    Run(server).state_read("echo before")
    run = Run(server)
    assert run.state_read("echo after") == "after"
    assert server.commands == [raw("echo before"), raw("echo before"), raw("echo after")]
    assert json.loads(cache.read_text()) == {deploy_key(run.state, NAME): raw("echo after")}
    Run(server).state_read("echo after")
    assert server.commands[3:] == [raw("echo after")]  # sent ahead and taken


def test_another_deploy_sends_nothing_ahead(server: Server) -> None:
    Run(server).state_read("echo site")
    Run(server, deploy=("deploy/doctor.py",))
    assert server.commands == [raw("echo site")]


def test_a_reconnection_sends_nothing_ahead(server: Server) -> None:
    Run(server).state_read("echo state")
    run = Run(server)
    assert run.state_read("echo state") == "state"
    run.host.disconnect()
    with ctx_state.use(run.state):
        run.host.connect(raise_exceptions=True)
    assert server.commands == [raw("echo state")] * 2


@pytest.mark.parametrize("password", [{"_sudo_password": "hunter2"}, {"_su_password": "hunter2"}])
def test_a_host_with_a_sudo_or_su_password_stores_nothing(
    server: Server, cache: Path, password: dict[str, str]
) -> None:
    assert Run(server, data=password).state_read("echo state") == "state"
    assert not cache.exists()


def test_the_key_is_the_directory_the_deploy_files_and_the_host(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(server)
    keys = {deploy_key(run.state, NAME), deploy_key(run.state, "other")}
    keys.add(deploy_key(Run(server, deploy=("deploy/host.py",)).state, NAME))
    keys.add(deploy_key(Run(server, deploy=("deploy/host.py", "deploy/site.py")).state, NAME))
    monkeypatch.chdir("/")
    keys.add(deploy_key(Run(server).state, NAME))
    assert len(keys) == 5
    assert deploy_key(State(), NAME) is None  # outside pyinfra's CLI


def test_the_newest_reads_are_kept(cache: Path) -> None:
    for index in range(KEPT + 2):
        store_read(f"key{index}", f"echo {index}")
    store_read("key5", "echo 5 again")
    kept = json.loads(cache.read_text())
    assert list(kept) == [*(f"key{index}" for index in range(2, KEPT + 2) if index != 5), "key5"]
    assert kept["key5"] == "echo 5 again"
    assert cache_path() == cache
