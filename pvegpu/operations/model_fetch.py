"""The model fetched and verified by `pvegpu-model-fetch.service` (pvegpu/fetch/main.py) on the host: a
serving host's own (`sglang.model_repo`) or the node's store (`model`).

Decided from the host's one state read (the fetcher's record and the model directory's file list, given by
the role; `pvegpu.plan.model_fetch.fetch_reason`): complete is a noop. Otherwise the hub venv gets the pinned
huggingface_hub (when it lacks it), the unit is started (or, already running, attached to: a run cut with
its SSH connection left it going) and the run waits for it, printing a progress line at most every
`PROGRESS_EVERY_S`, then fails with the fetcher's own line (the free-space refusal) or its journal.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

import pvegpu.fetch
from pvegpu.facts.model_store import (
    FetchLook,
    fetch_journal_command,
    fetch_look_command,
    fetch_start_command,
    parse_fetch_look,
)
from pvegpu.models.model_store import (
    FETCH_UNIT,
    HF_HUB_VERSION,
    HUB_VENV,
    FetchStatus,
    FetchTarget,
    ModelRecord,
    StoreFile,
)
from pvegpu.operations.api_command import api_command
from pvegpu.operations.render import render
from pvegpu.plan.model_fetch import ModelFetch, complete_line, fetch_reason, progress_line, size_text

PROGRESS_EVERY_S = 10.0
FETCHER = Path(pvegpu.fetch.__file__).with_name("main.py")
_POLL_S = 2.0
_START_GRACE_S = 30.0  # a `--no-block` start's job may not have run at the first look
STALL_S = 900.0
_RUNNING = ("activating", "active", "reloading", "deactivating")
JOURNAL_LINES = 20


def fetcher_source() -> str:
    """The fetcher as the host gets it: its one file, unchanged."""
    return FETCHER.read_text()


def fetch_unit(fetch: ModelFetch, role: str) -> str:
    """`pvegpu-model-fetch.service` of `fetch`, written by `role`."""
    target = fetch.target
    return render(
        "model/pvegpu-model-fetch.service.j2",
        role=role,
        repo=target.repo,
        model_path=target.path,
        user=target.user,
        token_file=target.token_file,
        exec_start=fetch.exec_start,
    )


def hub_venv_command(pip_args: Sequence[str]) -> StringCommand:
    """The hub venv with huggingface_hub==HF_HUB_VERSION: created, then installed only when it differs."""
    check = (
        f"import importlib.metadata as m, sys; sys.exit(m.version('huggingface_hub') != '{HF_HUB_VERSION}')"
    )
    python = QuoteString(f"{HUB_VENV}/bin/python")
    return StringCommand(
        "{", "[", "-x", python, "]", "||", "python3", "-m", "venv", QuoteString(HUB_VENV), ";", "}", "&&",
        "{", python, "-c", QuoteString(check), "2>/dev/null", "||",
        QuoteString(f"{HUB_VENV}/bin/pip"), "install", "--disable-pip-version-check", "--quiet",
        *map(QuoteString, pip_args), QuoteString(f"huggingface_hub=={HF_HUB_VERSION}"), ";", "}",
    )  # fmt: skip


def _look(model_path: str) -> FetchLook:
    _, output = host.run_shell_command(fetch_look_command(model_path), print_output=False)
    return parse_fetch_look(output.stdout_lines)


def _journal() -> str:
    _, output = host.run_shell_command(fetch_journal_command(JOURNAL_LINES), print_output=False)
    return "\n".join(output.stdout_lines)


def wait_for_fetch(model_path: str) -> None:
    """Start the unit, or attach to it when it runs (a run cut with its SSH connection left it going), then
    wait for its verdict, with progress lines."""
    if _look(model_path).active in _RUNNING:
        logger.info(f"{host.print_prefix}model: attaching to the fetch already running ({FETCH_UNIT})")
    else:
        host.run_shell_command(fetch_start_command(model_path), print_output=False)
    started = time.monotonic()
    last_line: tuple[float, int] | None = None
    last_byte = (started, -1)
    while True:
        look = _look(model_path)
        status, active, result = look.status, look.active, look.result
        now = time.monotonic()
        waiting = active in _RUNNING or (
            active == "inactive" and status is None and now - started < _START_GRACE_S
        )
        if not waiting:
            break
        if status is not None and status.state == "running" and status.total:
            if last_line is None or now - last_line[0] >= PROGRESS_EVERY_S:
                rate = None if last_line is None else (status.done - last_line[1]) / (now - last_line[0])
                logger.info(f"{host.print_prefix}{progress_line(status, rate)}")
                last_line = (now, status.done)
            if status.done != last_byte[1]:
                last_byte = (now, status.done)
        if now - last_byte[0] > STALL_S:
            raise OperationError(
                f"model: no byte in {STALL_S:.0f} s; {FETCH_UNIT} goes on, and the next run attaches to it"
            )
        time.sleep(_POLL_S)
    if status is not None and status.state == "verified":
        logger.info(f"{host.print_prefix}model: {status.message}")
        return
    if status is not None and status.state == "failed" and (status.message or "").startswith("model: "):
        raise OperationError(status.message or "")
    raise OperationError(
        f"model: {FETCH_UNIT} ended {result or active} ({_last(status)}); the next run resumes from the "
        f"bytes on disk; its last journal lines:\n{_journal()}"
    )


def _last(status: FetchStatus | None) -> str:
    if status is None:
        return "it wrote no status"
    done = f"{size_text(status.done)} of {size_text(status.total)}"
    return f"last status: {status.state}, {done}" + (f": {status.message}" if status.message else "")


@operation()
def model_fetch(
    *, target: FetchTarget, record: ModelRecord | None, files: Mapping[str, StoreFile] | None
) -> Generator[StringCommand | FunctionCommand]:
    """`target.repo`@`target.revision` complete in `target.path` (module docstring); `record` and `files`:
    the fetcher's record and the directory's files as the host's state read shows them."""
    reason = fetch_reason(target, record, files)
    if reason is None and record is not None:
        host.noop(complete_line(target, record))
        return
    logger.info(f"{host.print_prefix}model: {reason}")
    yield hub_venv_command(target.pip_args)
    yield api_command(wait_for_fetch, target.path)
