"""How far this run has got on a host: what the one-read-per-host caches (pvegpu/run/host_state.py,
pvegpu/run/node_state.py) key their reads on, and the line a run whose connection to a host was cut ends with.

- `commands_run(target)`: how many of the run's operations on a host have run commands.
- `CutReport`, a pyinfra state callback (pyinfra's own extension point, `State.add_callback_handler`; added
  once per run by `watch_cuts`). When an operation fails on a host whose connection is gone (pyinfra's SSH
  transport no longer active, or one of the operation's API calls lost its connection: `note_api_cut`), it
  logs the host's last line: `[pve1] connection lost during Prepare the Proxmox host | Set the kernel
  command line tokens pvegpu owns: nothing after it was written; run again`. pvegpu converges from observed
  state, so the next run finishes what the cut left.
- While pyinfra executes, an operation's body runs (`-y` skips change detection) and nothing guards it: a
  fact it reads after pyinfra's connection died fails the host (`State.fail_hosts`, which raises `No hosts
  remaining!` for the last one) inside the body, and that exception escapes through gevent with a greenlet
  traceback. `CutReport` guards each body when its operation starts on a host: an error of pyinfra's
  (`PyinfraError`, an `OperationError` too) or of the connection (`OSError`, `EOFError`, paramiko's
  `SSHException`) raised there fails the operation in one line instead, and a host that pyinfra failed
  mid-body (with other hosts left, the fact read returns its default) runs nothing more of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from weakref import WeakKeyDictionary

from paramiko import SSHException
from pyinfra import logger
from pyinfra.api.command import FunctionCommand, PyinfraCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, State

# Per run: host name -> the operation (hash) under which one of its API calls lost its connection.
_API_CUTS: WeakKeyDictionary[State, dict[str, str]] = WeakKeyDictionary()
# What a cut operation's generator is marked with, so that it is guarded once (pyinfra retries call it again).
_GUARDED = "_pvegpu_guarded"


def commands_run(target: Host) -> int:
    """How many of this run's operations on `target` have run commands so far (0 while pyinfra prepares)."""
    return sum(
        1
        for data in target.state.ops[target].values()
        if data.operation_meta.is_complete() and data.operation_meta.executed
    )


def note_api_cut(target: Host) -> None:
    """One of the API calls of the operation `target` executes now lost its connection (a no-op while no
    operation executes: a read that fails while pyinfra prepares refuses the run in its own line)."""
    op_hash = getattr(target, "executing_op_hash", None)  # (a stand-in host of the unit tests has none)
    if op_hash is not None:
        _API_CUTS.setdefault(target.state, {})[target.name] = op_hash


def pyinfra_connection_lost(target: Host) -> bool:
    """Whether pyinfra's SSH connection to `target` is gone (False for a connector without one)."""
    client = getattr(target.connector, "client", None)
    get_transport = getattr(client, "get_transport", None)
    if get_transport is None:
        return False
    transport = get_transport()
    return transport is None or not transport.is_active()


def cut_line(step: str) -> str:
    """The line a host whose connection was cut during operation `step` ends the run with."""
    return f"connection lost during {step}: nothing after it was written; run again"


class CutReport(BaseStateCallback):
    """The state callback of the module docstring."""

    @staticmethod
    def operation_host_start(state: State, host: Host, op_hash: Any) -> None:
        data = state.ops[host].get(op_hash)
        if data is None or getattr(data.command_generator, _GUARDED, False):
            return
        data.command_generator = _guarded(state, host, data.command_generator)

    @staticmethod
    def operation_host_error(
        state: State, host: Host, op_hash: Any, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        del retry_count, max_retries
        api_cut = _API_CUTS.get(state, {}).get(host.name) == op_hash
        if api_cut or pyinfra_connection_lost(host):
            step = " | ".join(state.get_op_meta(op_hash).names) or "an operation"
            host.log_styled(cut_line(step), fg="red", log_func=logger.error)


def watch_cuts(state: State) -> None:
    """Add `CutReport` to `state`'s callbacks, once."""
    if not any(isinstance(handler, CutReport) for handler in state.callback_handlers):
        state.add_callback_handler(CutReport())  # type: ignore[no-untyped-call]


def _guarded(
    state: State, host: Host, generator: Callable[[], Iterator[PyinfraCommand]]
) -> Callable[[], Iterator[PyinfraCommand]]:
    """`generator`, its pyinfra or connection errors (module docstring) yielded as one failing command."""

    def commands() -> Iterator[PyinfraCommand]:
        try:
            for command in generator():
                if host in state.failed_hosts:  # a fact read failed it: its default decides nothing
                    break
                yield command
            else:
                return
            failure = None
        except (PyinfraError, SSHException, OSError, EOFError) as error:
            failure = str(error) if host not in state.failed_hosts else None
        yield FunctionCommand(_failed, (failure,), {})

    setattr(commands, _GUARDED, True)
    return commands


def _failed(state: State, host: Host, failure: str | None) -> bool:
    """A FunctionCommand's body that fails the operation, with `failure`'s line when pyinfra printed none
    (pyinfra passes `state` and `host` to a function with these parameter names, and keeps its result)."""
    del state
    if failure:
        host.log_styled(failure, fg="red", log_func=logger.error)
    return False
