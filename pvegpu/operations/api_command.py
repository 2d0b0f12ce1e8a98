"""Failing a host in one line from an operation that talks to the Proxmox API.

- `api_command(function, *args)`: pyinfra logs a Python traceback for any exception a function command
  raises, a refusal included. An `api_command` runs its function with pyinfra's `(state, host)` signature
  instead: an OperationError is logged as one error line for the host (`[pve1] mapping gpu0 not created:
  POST /cluster/mapping/pci: ...`) and the command returns False, which fails the host and stops its later
  commands. Any other exception is a bug and escapes with its traceback.
- `attempt(write)` / `what_came_back(failure, endpoint)`: a write's PveError kept rather than raised, and
  the sentence saying what came back, so the caller reads the resource back before deciding what happened.
- `one_line_errors`: for an operation body (a generator). While pyinfra executes (`-y` skips change
  detection, so bodies run then), an OperationError raised by the body escapes through gevent, which
  prints a traceback before pyinfra's one-line `Operation error`; this turns it into a failing
  `api_command` instead. While pyinfra prepares (change detection, `--dry`) the OperationError is raised
  as it is: pyinfra prints it in one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import wraps
from typing import ParamSpec, TypeVar

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, PyinfraCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state

from pvegpu.pve.errors import PveConnectionError, PveError
from pvegpu.run.progress import note_api_cut

_P = ParamSpec("_P")
_C = TypeVar("_C", bound=PyinfraCommand)


def api_command(function: Callable[..., None], *args: object) -> FunctionCommand:
    """A FunctionCommand running `function(*args)`; its OperationError fails the host with one line."""

    # pyinfra passes (state, host) and keeps the return value only when the parameters have these names.
    def run(state: State, host: Host) -> bool:
        del state
        try:
            with ctx_host.use(host):  # the function logs through pyinfra's `host`, as in any operation
                function(*args)
        except OperationError as error:
            host.log_styled(str(error), fg="red", log_func=logger.error)
            if _connection_lost(error):
                note_api_cut(host)
            return False
        return True

    run.__name__ = getattr(function, "__name__", "api_command")
    return FunctionCommand(run, (), {})


def one_line_errors(
    body: Callable[_P, Generator[_C, None, None]],
) -> Callable[_P, Generator[_C | FunctionCommand, None, None]]:
    """`body`, its OperationError while pyinfra executes yielded as a failing `api_command` (see above)."""

    @wraps(body)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> Generator[_C | FunctionCommand, None, None]:
        try:
            yield from body(*args, **kwargs)
        except OperationError as error:
            state: State | None = ctx_state.get()  # type: ignore[no-untyped-call]
            if state is None or not state.is_executing:
                raise
            yield api_command(_fail, str(error))

    return run


def _fail(message: str) -> None:
    raise OperationError(message)


def attempt(write: Callable[[], object]) -> PveError | None:
    """Run `write`; its PveError, None when it answered without one (which proves nothing yet). A lost
    connection is noted for the host pyinfra runs it on (`note_api_cut`)."""
    try:
        write()
    except PveError as error:
        if isinstance(error, PveConnectionError) and ctx_host.isset():  # type: ignore[no-untyped-call]
            note_api_cut(ctx_host.get())  # type: ignore[no-untyped-call]
        return error
    return None


def _connection_lost(error: BaseException) -> bool:
    """Whether `error` was raised while handling a PveConnectionError (`raise ... from None` keeps it as the
    context, only hidden)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, PveConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def what_came_back(failure: PveError | None, endpoint: str) -> str:
    """What the write's endpoint answered, for a message: its error's first line, or that it had none."""
    return failure.line if failure is not None else f"{endpoint} answered without an error"
