"""The Proxmox API's failures as pvegpu raises them: `PveError` carries Proxmox's status and message
verbatim and the endpoint it came from; `PveResponseError` an answer that is not the API's; the connection's
and the tasks' own errors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass


class PveError(Exception):
    """An API call failed. `status` is the HTTP status (pvesh: the `NNN` of its error line, else 500),
    `message` Proxmox's text, `errors` the per-parameter messages of a 400, `endpoint` the call
    (`POST /cluster/mapping/pci`; set by PveClient, empty before)."""

    def __init__(self, status: int, message: str, errors: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.message = message
        self.errors = dict(errors or {})
        self.endpoint = ""
        lines = [f"{status} {message}", *(f"{key}: {text}" for key, text in sorted(self.errors.items()))]
        super().__init__("\n".join(lines))

    @property
    def line(self) -> str:
        """One line for an error message: `<endpoint>: <first line of the message>` (per-parameter errors
        follow it, `; `-joined)."""
        params = "".join(f"; {key}: {text}" for key, text in sorted(self.errors.items()))
        where = f"{self.endpoint}: " if self.endpoint else ""
        return f"{where}{first_line(self.message)}{params}"


class PveResponseError(PveError):
    """An endpoint answered something that is not the API's answer; the message says what was expected and
    the first line of what came."""

    def __init__(self, expected: str, got: object) -> None:
        super().__init__(502, f"expected {expected}, got {shown(got)}")


@dataclass(frozen=True)
class Unparsed:
    """What a call printed or returned that is not JSON: a handler's own lines before a null result (pvesh),
    or garbage (an HTML page, a cut-off reply)."""

    text: str


def first_line(text: str, limit: int = 160) -> str:
    """The first non-blank line of `text`, stripped and cut to `limit` characters (`…` marks a cut)."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def shown(got: object) -> str:
    """An answer as an error message quotes it: the first line of its text (JSON for data), repr-quoted;
    `nothing` for None."""
    if got is None:
        return "nothing"
    text = got.text if isinstance(got, Unparsed) else json.dumps(got, sort_keys=True, default=str)
    return repr(first_line(text))


class PveConnectionError(PveError):
    """The API could not be reached (TLS refused, connection failed); `message` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class PveConnectionLostError(PveConnectionError):
    """The connection ended after the call was sent: it may have run. A read (GET) is sent once more
    (`resent_if_read`); a write is not: callers read back what they wrote."""


class TaskFailedError(PveError):
    """A task ended with an exitstatus that is an error (`status_is_error`); `message` is the exitstatus,
    `upid` the task."""

    def __init__(self, upid: str, exitstatus: str) -> None:
        self.upid = upid
        super().__init__(500, exitstatus)


class TaskTimeoutError(PveError):
    """A task was still running when the wait's timeout ran out."""

    def __init__(self, upid: str, timeout: float) -> None:
        self.upid = upid
        super().__init__(504, f"task {upid} still running after {timeout:g} s")
