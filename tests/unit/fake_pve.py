"""A scripted Proxmox API for operation tests: answers per (method, path), records every call.

An answer is the `data` Proxmox returns, a `PveError` to raise, or a callable taking the params (for an
answer that changes between calls). Responses follow shared/knowledge/proxmox-api-behaviour.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from inspect import signature
from typing import Any

from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError

from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.pve.transport import Params

Call = tuple[str, str, dict[str, Any]]
UPID_START = "UPID:pve1:0000A1B2:0153F2C4:66A1B2C3:qmstart:100:root@pam:"
UPID_CREATE = "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:qmcreate:100:root@pam:"
NONCE = "5eed" * 8  # every create's nonce in unit tests (conftest fixes pve_guest.new_nonce)
NONCED = {"description": f"pvegpu-create: {NONCE}"}  # what a create adds to the keys it is given


class FakeApi:
    """`user`: the identity Proxmox sees sending every call (`acts_as`): root@pam, as under pvesh, or a
    token's id (an https backend without a root path)."""

    def __init__(self, answers: dict[tuple[str, str], object], user: str = "root@pam") -> None:
        self.answers = answers
        self.calls: list[Call] = []
        self.user = user

    def acts_as(self, method: str, path: str, params: Params) -> str:
        del method, path, params
        return self.user

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


class LogHost:
    """The host an `api_command` logs its one error line to."""

    print_prefix = "[pve1] "

    def __init__(self) -> None:
        self.errors: list[str] = []

    def log_styled(self, message: str, log_func: Callable[[str], Any], **_style: Any) -> None:
        del log_func
        self.errors.append(message)


def execute(commands: list[Any]) -> None:
    """Run the function commands an operation yielded, as pyinfra does when it executes; an `api_command`
    that fails its host (returns False) raises OperationError with the line it logged, as the first
    command of a host that fails stops the rest."""
    for command in commands:
        assert isinstance(command, FunctionCommand)
        if list(signature(command.function).parameters)[:2] == ["state", "host"]:
            host = LogHost()
            if command.function(None, host, *command.args, **command.kwargs) is False:
                raise OperationError("\n".join(host.errors))
        else:
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


MODIFIED = (
    "update hardware mapping failed: detected modified configuration - file changed by other user? Try again."
)


class MappingStore:
    """pci.cfg behind the mapping endpoints, as proxmox-api-behaviour.md §3 describes them: one digest over
    the whole file, changed by every write; a PUT with another digest fails with Proxmox's text, a POST of
    an existing id with `already defined`, a GET of a missing id with `not found`.

    `answers(*ids)` gives the FakeApi answers for the list and for each id. `after_write` (an error) is
    raised after a write took effect, as a connection cut after Proxmox wrote would; `checks` per id are
    what the list with `check-node` reports."""

    def __init__(self, *mappings: tuple[str, list[str]]) -> None:
        self.maps = {mapping_id: list(entries) for mapping_id, entries in mappings}
        self.descriptions: dict[str, str] = {}  # `description` per id, as pci.cfg keeps it
        self.version = 1
        self.checks: dict[str, list[dict[str, str]]] = {}
        self.after_write: PveError | None = None

    @property
    def digest(self) -> str:
        return f"d{self.version}"

    def answers(self, *ids: str) -> dict[tuple[str, str], object]:
        path = "/cluster/mapping/pci"
        answers: dict[tuple[str, str], object] = {("GET", path): self._list, ("POST", path): self._post}
        for mapping_id in ids:
            answers[("GET", f"{path}/{mapping_id}")] = lambda _params, i=mapping_id: self._get(i)
            answers[("PUT", f"{path}/{mapping_id}")] = lambda params, i=mapping_id: self._put(i, params)
        return answers

    def _list(self, _params: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"id": i, "type": "pci", "digest": self.digest, "map": m, "checks": self.checks.get(i, [])}
            | ({"description": self.descriptions[i]} if i in self.descriptions else {})
            for i, m in sorted(self.maps.items())
        ]

    def _get(self, mapping_id: str) -> dict[str, Any]:
        if mapping_id not in self.maps:
            raise PveError(500, f"mapping '{mapping_id}' not found")
        found = {"type": "pci", "digest": self.digest, "map": self.maps[mapping_id]}
        if mapping_id in self.descriptions:
            found["description"] = self.descriptions[mapping_id]
        return found

    def _post(self, params: dict[str, Any]) -> None:
        if params["id"] in self.maps:
            raise PveError(500, f"create hardware mapping failed: pci ID '{params['id']}' already defined")
        self._write(params["id"], params["map"], params.get("description"))

    def _put(self, mapping_id: str, params: dict[str, Any]) -> None:
        if params.get("digest") != self.digest:
            raise PveError(500, MODIFIED)
        self._write(mapping_id, params["map"], params.get("description"))

    def _write(self, mapping_id: str, entries: list[str], description: str | None = None) -> None:
        self.maps[mapping_id] = list(entries)
        if description is not None:
            self.descriptions[mapping_id] = description
        self.version += 1
        if self.after_write is not None:
            raise self.after_write


class ConfigStore:
    """A guest config behind `GET`/`PUT …/config`: a PUT with the current digest sets and deletes keys and
    changes the digest; another digest fails with `mismatch` (Proxmox's text for the kind, §4.5 / §6.3).
    `values` None: the guest does not exist (GET raises `missing`). `create(values, upid)` is the answer of a
    create POST that makes the config Proxmox would hold (`values`, with `digest`) and returns the UPID."""

    def __init__(self, values: dict[str, object] | None, *, missing: PveError, mismatch: str) -> None:
        self.values = None if values is None else dict(values)
        self.missing = missing
        self.mismatch = mismatch

    def get(self, _params: dict[str, Any]) -> dict[str, object]:
        if self.values is None:
            raise self.missing
        return dict(self.values)

    def put(self, params: dict[str, Any]) -> None:
        assert self.values is not None
        if params["digest"] != self.values["digest"]:
            raise PveError(500, self.mismatch)
        for key in str(params.get("delete", "")).split(","):
            self.values.pop(key, None)
        self.values.update({k: v for k, v in params.items() if k not in ("delete", "digest")})
        self.values["digest"] = f"{self.values['digest']}+"

    def create(self, values: Mapping[str, object], upid: str) -> Callable[[dict[str, Any]], str]:
        def answer(_params: dict[str, Any]) -> str:
            self.values = dict(values)
            return upid

        return answer
