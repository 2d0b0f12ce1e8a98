"""pvegpu.run.progress's `CutReport` under pyinfra's own executor (`run_ops` on `@local`, `-y` as the lab's
runs): a fact read over a dead connection inside an operation's body fails the host in one line with no
greenlet traceback, runs nothing more of the body, and a host whose connection was cut (pyinfra's, or an
API call's) ends with one line naming the step."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from types import SimpleNamespace

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError, PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.operation import add_op, operation
from pyinfra.api.operations import run_ops
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state, host
from pyinfra.facts.files import Sha256File

from pvegpu.operations.api_command import api_command
from pvegpu.pve.errors import PveConnectionLostError
from pvegpu.run.progress import watch_cuts
from tests.unit.pyinfra_local import local_state


@operation()
def read_then_write(seen: list[str]) -> Generator[FunctionCommand, None, None]:
    host.get_fact(Sha256File, path="/nonexistent/dir/file")  # fails (`failing_read`)
    yield FunctionCommand(seen.append, ("written",), {})


def cut_pyinfra_connection(target: Host) -> None:
    """pyinfra's SSH client as a cut leaves it: its transport no longer active."""
    transport = SimpleNamespace(is_active=lambda: False)
    target.connector.client = SimpleNamespace(get_transport=lambda: transport)  # type: ignore[attr-defined]


def executing(*other_hosts: str) -> tuple[State, Host]:
    state, local = local_state(*other_hosts)
    state.check_for_changes = False  # as `pyinfra -y`: bodies run while executing
    watch_cuts(state)
    watch_cuts(state)  # once only
    assert len(state.callback_handlers) == 1
    return state, local


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.fixture(autouse=True)
def context_kept() -> Iterator[None]:
    """pyinfra's context as before the test: `ctx_state.use` restores it on a normal exit only, and
    `run_ops` ends with `No hosts remaining!` in the first test."""
    state, target = ctx_state.get(), ctx_host.get()  # type: ignore[no-untyped-call]
    yield
    ctx_state.set(state)  # type: ignore[no-untyped-call]
    ctx_host.set(target)  # type: ignore[no-untyped-call]


@pytest.fixture(autouse=True)
def failing_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sha256File's command made one that fails, as over a cut connection (exit 255)."""

    def command(self: Sha256File, path: str) -> str:  # pyinfra passes every other parameter by name
        del self, path
        return "exit 255"

    monkeypatch.setattr(Sha256File, "command", command)


def test_error_fact_read_of_the_last_host_after_a_cut_is_one_line_no_traceback(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    state, local = executing()
    cut_pyinfra_connection(local)
    seen: list[str] = []
    add_op(state, read_then_write, seen, name="Write the snippet", host=local)

    with caplog.at_level(logging.DEBUG, logger="pyinfra"), pytest.raises(PyinfraError, match=r"^No hosts"):
        run_ops(state)

    assert seen == []
    assert errors(caplog) == [
        "[@local] Error: could not load fact: files.Sha256File path=/nonexistent/dir/file",
        "[@local] Error: executed 0 commands",
        "[@local] connection lost during Write the snippet: nothing after it was written; run again",
    ]
    assert "Traceback" not in caplog.text + capsys.readouterr().err


def test_error_fact_read_with_other_hosts_left_runs_nothing_more_of_the_body(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    state, local = executing("other-host")  # fail_hosts raises nothing: the read returns its default
    seen: list[str] = []
    add_op(state, read_then_write, seen, name="Write the snippet", host=local)

    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        run_ops(state)

    assert (seen, state.failed_hosts) == ([], {local})
    # pyinfra pads a host's prefix to the longest name; @local's connection is no cut: no cut line.
    assert errors(caplog)[-1] == "[@local]     Error: executed 0 commands"
    assert "Traceback" not in caplog.text + capsys.readouterr().err


@operation()
def refusing(text: str) -> Generator[FunctionCommand, None, None]:
    raise OperationError(text)
    yield  # a generator, as every operation body


def test_error_operation_error_of_a_body_while_executing_is_one_line(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    state, local = executing("other-host")
    add_op(state, refusing, "VM 100 not read: GET /nodes/pve1/qemu/100/config: cut", host=local)

    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        run_ops(state)

    assert errors(caplog) == [
        "[@local]     VM 100 not read: GET /nodes/pve1/qemu/100/config: cut",
        "[@local]     Error: executed 0 commands",
    ]
    assert "Traceback" not in caplog.text + capsys.readouterr().err


def lost_api(_arg: object) -> None:
    try:
        raise PveConnectionLostError("ssh root@pve1:22: connection lost after the command was sent: EOF")
    except PveConnectionLostError as error:
        raise OperationError(f"mapping gpu0 not created: POST /cluster/mapping/pci: {error.line}") from None


@operation()
def step(function: Callable[[object], None]) -> Generator[FunctionCommand, None, None]:
    yield api_command(function, None)


def test_error_api_connection_lost_ends_with_the_cut_line(caplog: pytest.LogCaptureFixture) -> None:
    state, local = executing("other-host")
    add_op(state, step, lost_api, name="Sync the PCI mappings", host=local)

    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        run_ops(state)

    assert errors(caplog)[1:] == [
        "[@local]     Error: executed 0 commands",
        "[@local]     connection lost during Sync the PCI mappings: nothing after it was written; run again",
    ]
