"""A scripted Proxmox API for operation tests: answers per (method, path), records every call.

An answer is the `data` Proxmox returns, a `PveError` to raise, or a callable taking the params (for an
answer that changes between calls). Responses follow shared/knowledge/proxmox-api-behaviour.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra.api.command import FunctionCommand

from pvegpu.pve import Params, PveClient, PveError

Call = tuple[str, str, dict[str, Any]]
UPID_START = "UPID:pve1:0000A1B2:0153F2C4:66A1B2C3:qmstart:100:root@pam:"
UPID_CREATE = "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:qmcreate:100:root@pam:"


class FakeApi:
    def __init__(self, answers: dict[tuple[str, str], object]) -> None:
        self.answers = answers
        self.calls: list[Call] = []

    def __call__(self, method: str, path: str, params: Params) -> object:
        sent = {key: value for key, value in params.items() if value is not None}
        self.calls.append((method, path, sent))
        answer = self.answers[(method, path)]
        if isinstance(answer, PveError):
            raise answer
        if callable(answer):
            return answer(sent)
        return answer

    @property
    def client(self) -> PveClient:
        return PveClient(self)

    def writes(self) -> list[Call]:
        return [call for call in self.calls if call[0] != "GET"]


def execute(commands: list[Any]) -> None:
    """Run the function commands an operation yielded, as pyinfra does when it executes."""
    for command in commands:
        assert isinstance(command, FunctionCommand)
        command.function(*command.args, **command.kwargs)


def task_ok(upid: str) -> dict[str, object]:
    return {"upid": upid, "status": "stopped", "exitstatus": "OK"}


def sequence(*answers: object) -> Callable[[dict[str, Any]], object]:
    """An answer that gives `answers` in turn, one per call."""
    left = list(answers)

    def answer(_params: dict[str, Any]) -> object:
        value = left.pop(0)
        if isinstance(value, PveError):
            raise value
        return value

    return answer
