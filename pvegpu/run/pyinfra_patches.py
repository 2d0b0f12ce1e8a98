"""Two of pyinfra's per-operation costs, removed with the same results: each stands in for an upstream fix
(named below); drop it then. Measured on a no-op `deploy/site.py` on the lab's node + guest (36 operations),
they were ~0.3 s of the run's CPU above pyinfra's floor.

- The operation order. pyinfra orders a deploy's operations by the line numbers of the calls that added
  them (`pyinfra.api.util.get_operation_order_from_stack`, for every operation on every host). It takes
  them from `inspect.stack()` and then `inspect.getframeinfo(frame)` per frame, both with one line of
  context: each frame's source file is searched (`findsource`, which walks `sys.modules`) for a line never
  used. `call_sites` gives the same file names and line numbers from the frames themselves, as
  `getframeinfo` computes them before it reads any context (and before `getsourcefile` stats the file,
  which gives the code's own file name back). Upstream fix: both calls with `context=0`.
- The global arguments. `pyinfra.api.arguments.all_global_arguments()` evaluates the type hints of
  `AllArguments` (a TypedDict of ~40 keys, fixed at import) on every call, i.e. for every operation and
  fact. `global_arguments` evaluates them once. Upstream fix: cache them in pyinfra.

`install()` swaps both in where pyinfra looks them up. It also makes a cut connection one line, neither
of which patches pyinfra:

- `pvegpu.run.progress.CutReport` is added to the run's state callbacks (`watch_cuts`).
- paramiko's warnings and errors go to pyinfra's debug log (`pyinfra --debug` shows them). paramiko logs
  every failed handshake at ERROR with its traceback, one record per line (`Exception (client): Error
  reading SSH protocol banner`, then `Traceback (most recent call last):` ...), through the
  `paramiko.transport` logger; pyinfra's CLI gives that logger no handler, so Python's last-resort handler
  printed each of them on stderr while a node's link was down (the reconnecting waits try every few
  seconds). The failure itself reaches pyinfra and pvegpu as an exception, reported in their own lines.
  Routed when pyinfra loads the repository's group data (group_data/all.py), before it first connects, and
  again from the deploy's start (`pvegpu.run.dispatch`) for a run whose group data is not the repository's.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import logging
import sys
from types import FrameType
from typing import Any

import pyinfra
from pyinfra.api import arguments
from pyinfra.api.util import PYINFRA_INSTALL_DIR
from pyinfra.context import ctx_state

from pvegpu.run.progress import watch_cuts

# The modules, not the `operation` decorator and the `facts` names `pyinfra.api` exports.
_OPERATION: Any = importlib.import_module("pyinfra.api.operation")
_FACTS: Any = importlib.import_module("pyinfra.api.facts")


def call_sites() -> list[tuple[str, int]]:
    """(file name, line) of every frame from the caller of this function out, as `inspect.stack(0)` gives
    them (`getframeinfo`: the code's file name, and the first line of the position of the frame's current
    instruction, else `f_lineno`), without its `getsourcefile` per frame."""
    sites = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code, index = frame.f_code, frame.f_lasti
        start = next(itertools.islice(code.co_positions(), index // 2, None))[0] if index >= 0 else None
        sites.append((code.co_filename, frame.f_lineno if start is None else start))
        frame = frame.f_back
    return sites


def order_from_stack(state: Any) -> list[int]:
    """pyinfra's `get_operation_order_from_stack(state)`, line for line, on `call_sites()`: the line
    numbers of the calls from the first frame of the deploy file being run, pyinfra's own frames left out,
    after the deploy file's index when running from the CLI."""
    frames = list(reversed(call_sites()))  # the last one is this function's: left out, as pyinfra's is
    first = 0
    if state.current_deploy_filename:
        for first, (filename, _) in enumerate(frames):  # noqa: B007  (the loop leaves `first` at the match, as pyinfra's)
            if filename == state.current_deploy_filename:
                break
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    line_numbers += [
        lineno for filename, lineno in frames[first:-1] if not filename.startswith(PYINFRA_INSTALL_DIR)
    ]
    return line_numbers


@functools.cache
def _global_argument_types() -> tuple[tuple[str, type], ...]:
    return tuple(_ORIGINAL_GLOBAL_ARGUMENTS())


_ORIGINAL_GLOBAL_ARGUMENTS = arguments.all_global_arguments


def global_arguments() -> list[tuple[str, type]]:
    """pyinfra's `all_global_arguments()`: every global argument's name and type, evaluated once; a new list
    each call, as pyinfra's."""
    return list(_global_argument_types())


class ParamikoToDebug(logging.Handler):
    """Each record of paramiko's log as one line of pyinfra's debug log."""

    def emit(self, record: logging.LogRecord) -> None:
        pyinfra.logger.debug("[%s] %s", record.name, record.getMessage())


def route_paramiko_log() -> None:
    """Give paramiko's logger `ParamikoToDebug` (once): Python's last-resort handler no longer prints it."""
    paramiko_log = logging.getLogger("paramiko")
    if not any(isinstance(handler, ParamikoToDebug) for handler in paramiko_log.handlers):
        paramiko_log.addHandler(ParamikoToDebug())


def install() -> None:
    """Make pyinfra take its operation order from `order_from_stack` and its global arguments from
    `global_arguments`; report cut connections in one line (module docstring). Idempotent."""
    _OPERATION.get_operation_order_from_stack = order_from_stack
    arguments.all_global_arguments = global_arguments  # pop_global_arguments looks it up here
    _FACTS.all_global_arguments = global_arguments
    route_paramiko_log()
    if ctx_state.isset():  # type: ignore[no-untyped-call]
        watch_cuts(ctx_state.get())  # type: ignore[no-untyped-call]
