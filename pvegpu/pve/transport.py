"""One API call as a transport: the `pvesh` argv (every list value a repeated option, booleans 1/0), its
output parsed, `RootRouted` sending what only root@pam may set through root's pvesh and the rest through the
token, and a read sent again once when the connection was lost under it (`resent_if_read`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar, runtime_checkable

from pvegpu.models.pve_root_only import ROOT_USER, root_only_params
from pvegpu.pve.errors import PveConnectionLostError, PveError, Unparsed

Method = Literal["GET", "POST", "PUT", "DELETE"]
_R = TypeVar("_R")
Value = str | int | bool | Sequence[str]
Params = Mapping[str, Value | None]

PVESH_VERBS: dict[str, str] = {"GET": "get", "POST": "create", "PUT": "set", "DELETE": "delete"}
_STATUS_LINE = re.compile(r"(\d\d\d) (\S.*)")
_PARAM_LINE = re.compile(r"([\w.\-\[\]]+): (.*)")


def resent_if_read(method: Method, send: Callable[[], _R]) -> _R:
    """`send()`; for a GET, once more when the connection was lost under it. A read changes nothing, so
    sending it again is safe, and a node going down (a reboot) between the check that the connection is up
    and the answer costs no failed run. A write is never sent twice: it may have run."""
    try:
        return send()
    except PveConnectionLostError:
        if method != "GET":
            raise
        return send()


class Transport(Protocol):
    """One API call: returns the `data` of the response (None for calls that return nothing; `Unparsed`
    for an answer that is not JSON)."""

    def __call__(self, method: Method, path: str, params: Params) -> object: ...


@runtime_checkable
class Identified(Protocol):
    """A transport that says which Proxmox identity sends a call (`root@pam`, `user@realm!token`)."""

    def acts_as(self, method: Method, path: str, params: Params) -> str: ...


def acts_as(transport: Transport, method: Method, path: str, params: Params) -> str:
    """Who sends `method path params` through `transport`: its own answer when it is `Identified`, else
    root@pam (pvesh, as root on the node)."""
    return transport.acts_as(method, path, params) if isinstance(transport, Identified) else ROOT_USER


@dataclass
class RootRouted:
    """The `https` backend's transport when pvegpu reaches the node as root over SSH: a call that carries
    what only root@pam may send (pvegpu.models.pve_root_only `root_only_params`: `hookscript`, `args`,
    `hugepages`, `affinity`, a `delete` of one, `skiplock`, a raw `host=` device, a CT's `devN`) goes
    through root's `pvesh` on the node, every other call through the token (`token`, acting as
    `token_id`). `root` makes the root transport on the first call that needs it, so a run that writes no
    such key never opens that SSH connection. A PUT carries its GET's digest through either identity:
    Proxmox checks it against the config file, whoever read it."""

    token: Transport
    token_id: str
    root: Callable[[], Transport]
    _root: Transport | None = field(default=None, init=False, repr=False)

    def __call__(self, method: Method, path: str, params: Params) -> object:
        if self.acts_as(method, path, params) == ROOT_USER:
            if self._root is None:
                self._root = self.root()
            return self._root(method, path, params)
        return self.token(method, path, params)

    def acts_as(self, method: Method, path: str, params: Params) -> str:
        return ROOT_USER if root_only_params(method, path, params) else self.token_id


def pvesh_argv(method: Method, path: str, params: Params, *, sudo: bool = False) -> list[str]:
    """The exact `pvesh` argv for one call: `--key value` per parameter in the given order, a list as the
    key repeated once per item, booleans `1`/`0`, None values left out, then `--output-format json`."""
    argv = ["sudo"] if sudo else []
    argv += ["pvesh", PVESH_VERBS[method], path]
    for key, value in params.items():
        if value is None:
            continue
        items = [value] if isinstance(value, str | int | bool) else list(value)
        for item in items:
            argv += [f"--{key}", param_text(item)]
    return [*argv, "--output-format", "json"]


def param_text(value: str | int | bool) -> str:
    """A parameter's text as the API takes it: booleans `1`/`0`."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def parse_pvesh_output(stdout: str, stderr: str, exit_code: int) -> object:
    """The result of a pvesh run: the JSON after any worker/handler output lines, None when it printed
    nothing, `Unparsed(stdout)` when no JSON ends it (a handler's lines before a null result, or garbage).

    A non-zero exit raises PveError: `NNN message` lines give the status (`400 Parameter verification
    failed.` with one `param: message` line each, up to the usage line); a plain die is status 500 with
    the whole stderr as the message. Stderr of a successful run (a failed task's error, warnings) is not
    an error: the task status says how a task ended.
    """
    if exit_code != 0:
        raise _pvesh_error(stderr)
    lines = stdout.splitlines()
    for start in range(len(lines)):
        try:
            return json.loads("\n".join(lines[start:]))
        except ValueError:
            continue
    return Unparsed(stdout) if stdout.strip() else None


def _pvesh_error(stderr: str) -> PveError:
    lines = [line for line in stderr.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        status = _STATUS_LINE.fullmatch(line)
        if status is None:
            continue
        errors = {}
        for rest in lines[index + 1 :]:
            param = _PARAM_LINE.fullmatch(rest)
            if param is None or rest.startswith(("pvesh ", "USAGE: ")):
                break
            errors[param[1]] = param[2]
        message = "\n".join([*lines[:index], status[2]])
        return PveError(int(status[1]), message, errors)
    return PveError(500, stderr.strip() or "pvesh failed without a message")


Runner = Callable[[list[str]], tuple[str, str, int]]


@dataclass(frozen=True)
class CommandTransport:
    """Calls through `pvesh`, run by `runner` (argv -> stdout, stderr, exit code)."""

    runner: Runner
    sudo: bool = False

    def __call__(self, method: Method, path: str, params: Params) -> object:
        argv = pvesh_argv(method, path, params, sudo=self.sudo)
        stdout, stderr, exit_code = resent_if_read(method, lambda: self.runner(argv))
        return parse_pvesh_output(stdout, stderr, exit_code)
