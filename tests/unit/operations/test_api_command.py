"""`api_command` and `one_line_errors` under pyinfra's own executor (`run_ops` on `@local`): a refusal fails
the host with one error line and no traceback; a success lets the host go on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import add_op, operation
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_state

from pvegpu.operations.api_command import api_command, one_line_errors
from tests.unit.pyinfra_local import local_state


@operation()
def step(function: Callable[..., None], arg: object) -> Generator[FunctionCommand, None, None]:
    yield api_command(function, arg)


def refuse(text: str) -> None:
    raise OperationError(text)


def record(seen: list[str]) -> None:
    seen.append("ran")


def test_error_refusal_fails_the_host_with_one_line_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, local = local_state("other-host")
    add_op(state, step, refuse, "mapping gpu0 not created: POST /cluster/mapping/pci: cut", host=local)

    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        run_ops(state)

    assert state.failed_hosts == {local}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "[@local]     mapping gpu0 not created: POST /cluster/mapping/pci: cut",
        "[@local]     Error: executed 0 commands",  # pyinfra's own summary of a failed operation
    ]
    assert "Traceback" not in caplog.text
    assert "Unexpected error in Python callback" not in caplog.text


def test_success_lets_the_host_go_on() -> None:
    state, local = local_state()
    seen: list[str] = []
    add_op(state, step, record, seen, host=local)

    run_ops(state)

    assert (seen, state.failed_hosts) == (["ran"], set())


@operation()
@one_line_errors
def reading(text: str) -> Generator[FunctionCommand, None, None]:
    raise OperationError(text)
    yield  # a generator, as every operation body


def test_error_raised_by_a_body_while_executing_fails_the_host_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, local = local_state("other-host")
    state.check_for_changes = False  # as `pyinfra -y`: bodies run while executing
    add_op(
        state, reading, "PCI mappings not read: GET /cluster/mapping/pci: cut; nothing written", host=local
    )

    with ctx_state.use(state), caplog.at_level(logging.DEBUG, logger="pyinfra"):
        run_ops(state)

    assert state.failed_hosts == {local}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "[@local]     PCI mappings not read: GET /cluster/mapping/pci: cut; nothing written",
        "[@local]     Error: executed 0 commands",
    ]
    assert "Traceback" not in caplog.text


def test_error_raised_by_a_body_while_preparing_is_raised() -> None:
    state, local = local_state()  # change detection on, as `pyinfra --dry`: pyinfra prints it in one line

    with ctx_state.use(state), pytest.raises(OperationError, match=r"^refused$"):
        add_op(state, reading, "refused", host=local)
