"""A small typed interface to the Proxmox VE API, over proxmoxer 2.3.0.

Backends (`pvegpu.pve_https.connect_https`, `ssh_transport`, `connect_local`):

- `https`: proxmoxer's requests backend with an API token (`user@realm!name` + secret), in
  pvegpu/pve_https.py (so that the other backends never import requests). TLS is verified against the
  system CAs by default, or against `ca_file`; with `fingerprint` the certificate is pinned instead.
- `ssh`: proxmoxer's paramiko session runs `pvesh` on the node. The host key must already be known
  (system known_hosts or `known_hosts`): an unknown key is refused, never added. TCP_NODELAY is set on
  its socket (pvegpu.ssh_nodelay). A connection that is gone (the node rebooted) is re-established before
  the next call.
- `local`: proxmoxer's local session runs `pvesh` on this node.

A token is never root@pam, and Proxmox lets only root@pam send some writes (pvegpu.models.pve_root_only:
`hookscript`, `args`, `hugepages`, `affinity`, `lock`, `skiplock`, raw `host=`, a CT's `devN`). `RootRouted`
sends those through root's `pvesh` on the node over SSH (`ssh_transport`) and every other call through the
token; `PveClient.acts_as` says which identity a call goes out as (a create's task runs as that user).

The command backends build the `pvesh` argv here rather than through proxmoxer's flattening, which sends a
list as ONE argument (`-map "['a', 'b']"`, an invalid mapping): every list value becomes a repeated option
(`--map A --map B`), booleans `1`/`0`. pvesh runs async calls to completion, prints worker output then the
UPID, and exits 0 even when the task failed (shared/knowledge/proxmox-api-behaviour.md §0.1): the task's
`exitstatus` is the only truth, so every UPID is waited for (`wait_task`).

Every API failure raises `PveError` carrying Proxmox's status and message verbatim and the endpoint it came
from (`PUT /cluster/mapping/pci/gpu0`); `PveError.line` says both in one line. An answer that is not the
API's (an HTML page, cut-off or unparsable JSON, JSON of the wrong shape) raises `PveResponseError` naming
the endpoint and the answer's first line. A connection lost under a sent call raises
`PveConnectionLostError`; a read (GET) is sent once more first, a write never (`resent_if_read`). A write
that returns nothing proves nothing: pvesh prints the handler's own lines there (`update VM 100: -cores 4`),
so callers read back what they wrote.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import paramiko
from proxmoxer.backends.local import LocalSession
from proxmoxer.backends.ssh_paramiko import SshParamikoSession

from pvegpu.models.pve import (
    GuestConfig,
    GuestInterface,
    MappingCheck,
    MappingState,
    PciMapping,
    Severity,
    StorageConfig,
    StorageVolume,
    TaskStatus,
    VmStatus,
)
from pvegpu.models.pve_root_only import ROOT_USER, root_only_params
from pvegpu.ssh_nodelay import nodelay_transport
from pvegpu.wait import WaitTimeoutError, wait_until

_LOG = logging.getLogger(__name__)
Method = Literal["GET", "POST", "PUT", "DELETE"]
_R = TypeVar("_R")
Value = str | int | bool | Sequence[str]
Params = Mapping[str, Value | None]

PVESH_VERBS: dict[str, str] = {"GET": "get", "POST": "create", "PUT": "set", "DELETE": "delete"}
_STATUS_LINE = re.compile(r"(\d\d\d) (\S.*)")
_PARAM_LINE = re.compile(r"([\w.\-\[\]]+): (.*)")
UPID = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9.\-]+):[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:[0-9A-Fa-f]{8}:[^:\s/]+:[^:\s/]*:[^:\s/]+:"
)


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


# ---------------------------------------------------------------------------------------------- pvesh


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


class _KnownHostsSession(SshParamikoSession):
    """proxmoxer's paramiko session, but an unknown host key is refused (proxmoxer auto-adds it)."""

    def __init__(self, known_hosts: str | None, **kwargs: Any) -> None:
        self.known_hosts = known_hosts
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def _connect(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.load_system_host_keys()
        if self.known_hosts is not None:
            client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=self.private_key_file,
                allow_agent=True,
                look_for_keys=self.private_key_file is None,
                timeout=self.timeout,
                transport_factory=nodelay_transport,
            )
        except BaseException:
            client.close()  # paramiko leaves the transport open on a refused key or login
            raise
        return client

    def run(self, argv: list[str]) -> tuple[str, str, int]:
        """Run `argv` on the node: (stdout, stderr, exit code).

        The connection is re-established first when it is gone (a reboot of the node drops it), and once
        more when opening the channel fails: the command was not sent then. A connection lost after it was
        sent raises PveConnectionLostError (it may have run: callers read back what they wrote)."""
        where = f"ssh {self.user}@{self.host}:{self.port}"
        try:
            channel = self._channel()
        except (paramiko.SSHException, EOFError, OSError):
            self._reconnect()
            try:
                channel = self._channel()
            except (paramiko.SSHException, EOFError, OSError) as error:
                raise PveConnectionError(f"{where}: {error or type(error).__name__}") from None
        lost = f"{where}: connection lost after the command was sent"
        try:
            channel.exec_command(shlex.join(argv))
            stdout = channel.makefile("rb", -1).read().decode()
            stderr = channel.makefile_stderr("rb", -1).read().decode()
            exit_code = channel.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as error:
            raise PveConnectionLostError(f"{lost}: {error or type(error).__name__}") from None
        if exit_code == -1 and _connection_ended(channel.get_transport()):
            raise PveConnectionLostError(f"{lost}: no exit status") from None
        return stdout, stderr, exit_code

    def _channel(self) -> paramiko.Channel:
        transport = self.ssh_client.get_transport()
        if transport is None or not transport.is_active():
            self._reconnect()
            transport = self.ssh_client.get_transport()
        if transport is None:
            raise paramiko.SSHException("SSH session not active")
        channel: paramiko.Channel = transport.open_session()
        return channel

    def _reconnect(self) -> None:
        _LOG.debug("Reconnecting to %s@%s:%s: the connection is gone", self.user, self.host, self.port)
        self.ssh_client.close()
        try:
            self.ssh_client = self._connect()
        except (paramiko.SSHException, OSError) as error:
            where = f"ssh {self.user}@{self.host}:{self.port}"
            raise PveConnectionError(f"{where}: reconnecting: {error}") from None


_TRANSPORT_END_S = 2.0


def _connection_ended(transport: paramiko.Transport) -> bool:
    """Whether the SSH connection under a channel that closed without an exit status has ended. Such a close
    is either the connection's end or a command killed by a signal (OpenSSH then sends `exit-signal`, which
    paramiko does not read); paramiko's transport thread closes the channels first and ends just after
    when the connection is gone, so it is given a moment."""
    transport.join(_TRANSPORT_END_S)
    return not transport.is_active()


def ssh_transport(
    host: str,
    user: str = "root",
    *,
    port: int = 22,
    key_filename: str | None = None,
    known_hosts: str | None = None,
    sudo: bool = False,
    timeout: float = 30,
) -> CommandTransport:
    """`pvesh` on `host` over SSH (paramiko), connected now. The host key must be in the system known_hosts
    or in `known_hosts`; otherwise PveConnectionError, nothing is added (as for a refused connection). A
    dropped connection (the node rebooted) is re-established before the next call
    (`_KnownHostsSession.run`)."""
    try:
        session = _KnownHostsSession(
            known_hosts, host=host, user=user, private_key_file=key_filename, port=port, timeout=timeout
        )
    except (paramiko.SSHException, OSError) as error:
        raise PveConnectionError(f"ssh {user}@{host}:{port}: {error}") from None

    def run(argv: list[str]) -> tuple[str, str, int]:
        _LOG.debug("Running pvesh on %s: %s", host, shlex.join(argv))  # scripts/bench.py counts these
        return session.run(argv)

    return CommandTransport(run, sudo=sudo)


def connect_local(*, sudo: bool = False, timeout: float = 600) -> PveClient:
    """A client running `pvesh` on this node (proxmoxer's local session); `timeout` bounds one call,
    which under pvesh includes a whole task."""
    session = LocalSession(timeout=timeout)  # type: ignore[no-untyped-call]

    def run(argv: list[str]) -> tuple[str, str, int]:
        stdout, stderr, exit_code = session._exec(argv)  # type: ignore[no-untyped-call]
        return str(stdout), str(stderr), int(exit_code)

    return PveClient(CommandTransport(run, sudo=sudo))


# ---------------------------------------------------------------------------------------------- client


@dataclass(frozen=True)
class PveClient:
    """The API calls pvegpu makes. Paths and parameters are Proxmox's (proxmox-api-behaviour.md).

    Every PveError leaving a method carries the endpoint (`PveError.line`); an answer of the wrong kind
    raises PveResponseError. Writes that return nothing are not proof of anything: read back."""

    call: Transport

    def acts_as(self, method: Method, path: str, params: Params) -> str:
        """Who Proxmox sees sending `method path params` (`root@pam`, or the token id): the identity a
        create's task runs as (its UPID's user), and whether a root-only call can be sent at all."""
        return acts_as(self.call, method, path, params)

    def _call(self, method: Method, path: str, params: Params) -> object:
        try:
            return self.call(method, path, params)
        except PveError as error:
            error.endpoint = error.endpoint or f"{method} {path}"
            raise

    def _read(self, path: str, params: Params, parse: Callable[[object], _T]) -> _T:
        """`GET path`, its data parsed by `parse`; an answer `parse` cannot take is a PveResponseError."""
        data = self._call("GET", path, params)
        try:
            return parse(data)
        except _ShapeError as shape:
            raise _response_error(f"GET {path}", shape.expected, data) from None
        except KeyError as missing:
            raise _response_error(f"GET {path}", f"an object with {missing.args[0]!r}", data) from None
        except (TypeError, ValueError) as error:
            raise _response_error(f"GET {path}", f"Proxmox's format ({error})", data) from None

    def _write(self, method: Method, path: str, params: Params) -> None:
        """A call whose result is null: None, or under pvesh the handler's own lines (`Unparsed`)."""
        data = self._call(method, path, params)
        if data is not None and not isinstance(data, Unparsed):
            raise _response_error(f"{method} {path}", "no data", data)

    def _task(self, method: Method, path: str, params: Params) -> str:
        """A call that starts a task: its UPID."""
        data = self._call(method, path, params)
        if not isinstance(data, str) or UPID.fullmatch(data) is None:
            raise _response_error(f"{method} {path}", "a task id (UPID)", data)
        return data

    # -- access
    def permissions(self, path: str) -> frozenset[str]:
        """`GET /access/permissions?path=<path>`: the privileges the calling identity holds on `path`
        (pve-access-control API2/AccessControl.pm `permissions`; a privilege-separated token's answer is
        what the token itself may do). `{}` for a path it holds nothing on."""

        def parse(data: object) -> frozenset[str]:
            return frozenset(str(name) for name in _dict(_dict(data).get(path, {})))

        return self._read("/access/permissions", {"path": path}, parse)

    # -- cluster PCI mappings
    def mappings(self, check_node: str | None = None) -> tuple[MappingState, ...]:
        """`GET /cluster/mapping/pci`; with `check_node`, each mapping's checks for that node."""
        checked = check_node is not None
        return self._read(
            "/cluster/mapping/pci",
            {"check-node": check_node},
            lambda data: tuple(_mapping_state(item, checked=checked) for item in _list(data)),
        )

    def mapping(self, mapping_id: str) -> MappingState | None:
        """`GET /cluster/mapping/pci/{id}`, None when Proxmox says `mapping '<id>' not found`."""
        try:
            return self._read(
                f"/cluster/mapping/pci/{mapping_id}",
                {},
                lambda data: _mapping_state({**_dict(data), "id": mapping_id}, checked=False),
            )
        except PveResponseError:
            raise
        except PveError as error:
            if error.message == f"mapping '{mapping_id}' not found":
                return None
            raise

    def create_mapping(self, mapping: PciMapping) -> None:
        """`POST /cluster/mapping/pci` (`pci ID '<id>' already defined` when it exists)."""
        self._write("POST", "/cluster/mapping/pci", {"id": mapping.id, **_mapping_params(mapping)})

    def update_mapping(self, mapping: PciMapping, digest: str) -> None:
        """`PUT /cluster/mapping/pci/{id}` with the whole `map` and the `digest` of the GET it is based on:
        a concurrent edit fails with Proxmox's `detected modified configuration` error, nothing written."""
        params = {**_mapping_params(mapping), "digest": digest}
        self._write("PUT", f"/cluster/mapping/pci/{mapping.id}", params)

    def delete_mapping(self, mapping_id: str) -> None:
        """`DELETE /cluster/mapping/pci/{id}` (a missing id is not an error)."""
        self._write("DELETE", f"/cluster/mapping/pci/{mapping_id}", {})

    # -- qemu
    def create_vm(self, node: str, vmid: int, config: Params) -> str:
        """`POST /nodes/{node}/qemu`; returns the UPID (wait for it: creation runs as a task)."""
        return self._task("POST", f"/nodes/{node}/qemu", {"vmid": vmid, **config})

    def vm_config(self, node: str, vmid: int, current: bool = False) -> GuestConfig:
        """`GET …/qemu/{vmid}/config` with pending values applied (what the next cold start gets), plus its
        `digest`; `current`: the values in effect now, without the `[PENDING]` section (`current=1`)."""
        params: Params = {"current": True} if current else {}
        return self._read(f"/nodes/{node}/qemu/{vmid}/config", params, _guest_config)

    def update_vm_config(
        self, node: str, vmid: int, values: Params, digest: str, delete: Sequence[str] = ()
    ) -> None:
        """`PUT …/qemu/{vmid}/config` (synchronous) with the GET's `digest`: a concurrent edit fails with
        `checksum mismatch (file change by other user?)`. `delete` removes keys."""
        params = {**values, "delete": ",".join(delete) or None, "digest": digest}
        self._write("PUT", f"/nodes/{node}/qemu/{vmid}/config", params)

    def unlock_vm(self, node: str, vmid: int, digest: str) -> None:
        """`PUT …/qemu/{vmid}/config` with `delete=lock`, `skiplock=1` and the GET's `digest`: what `qm
        unlock` does. Only root@pam may (`skiplock: Only root may use this option.`)."""
        params: Params = {"delete": "lock", "skiplock": True, "digest": digest}
        self._write("PUT", f"/nodes/{node}/qemu/{vmid}/config", params)

    def destroy_vm(self, node: str, vmid: int) -> str:
        """`DELETE /nodes/{node}/qemu/{vmid}` with neither `purge` nor `destroy-unreferenced-disks`: it frees
        only the volumes its config names that `vmid` owns (qemu-server QemuServer.pm destroy_vm; the
        caller frees the others it proves its own: `delete_volume`) and edits no backup, replication or HA
        entry; returns the UPID. Refused before a task (API2/Qemu.pm destroy_vm's early checks): a VM in HA
        (`unable to remove VM 100 - used in HA resources and purge parameter not set.`), one with a
        replication job (`There is a replication job '100-0' for guest '100' - Please remove that
        first.`), a running one (`VM 100 is running - destroy failed`); a locked one fails the task (`VM is
        locked (create)`). A backup job naming `vmid` is left as it is."""
        return self._task("DELETE", f"/nodes/{node}/qemu/{vmid}", {})

    def start_vm(self, node: str, vmid: int) -> str:
        """`POST …/status/start`; returns the UPID. A failed start (e.g. an invalid mapping) still returns
        one: `wait_task` raises with the task's exitstatus."""
        return self._task("POST", f"/nodes/{node}/qemu/{vmid}/status/start", {})

    def stop_vm(self, node: str, vmid: int) -> str:
        """`POST …/status/stop`; returns the UPID (stopping a stopped VM succeeds)."""
        return self._task("POST", f"/nodes/{node}/qemu/{vmid}/status/stop", {})

    def vm_status(self, node: str, vmid: int) -> VmStatus:
        """`GET …/qemu/{vmid}/status/current`."""
        return self._read(f"/nodes/{node}/qemu/{vmid}/status/current", {}, _vm_status)

    def shutdown_vm(self, node: str, vmid: int, timeout_s: int) -> str:
        """`POST …/status/shutdown` (the guest OS shuts down cleanly) with `timeout`; returns the UPID (the
        task fails when the guest is still running after `timeout_s`)."""
        return self._task("POST", f"/nodes/{node}/qemu/{vmid}/status/shutdown", {"timeout": timeout_s})

    def agent_get(
        self, node: str, vmid: int, command: str, params: Params | None = None
    ) -> dict[str, object]:
        """`GET …/qemu/{vmid}/agent/{command}` (`get-fsinfo`, `file-read` with `file`): the answer object
        (`{"result": ...}`, file-read's `{"content": ...}`). A PveError while the agent does not answer
        (`QEMU guest agent is not running`) or the command fails in the guest."""
        return self._read(f"/nodes/{node}/qemu/{vmid}/agent/{command}", params or {}, _dict)

    def agent_post(self, node: str, vmid: int, command: str, params: Params) -> object:
        """`POST …/qemu/{vmid}/agent/{command}` (`file-write` with `file`, `content`): its data, None for
        none (read back what was written)."""
        data = self._call("POST", f"/nodes/{node}/qemu/{vmid}/agent/{command}", params)
        return None if isinstance(data, Unparsed) else data

    # -- lxc
    def lxc_config(self, node: str, vmid: int) -> GuestConfig:
        """`GET …/lxc/{vmid}/config` (raw `lxc.*` lines under the key `lxc`), plus its `digest`."""
        return self._read(f"/nodes/{node}/lxc/{vmid}/config", {}, _guest_config)

    def update_lxc_config(
        self, node: str, vmid: int, values: Params, digest: str, delete: Sequence[str] = ()
    ) -> None:
        """`PUT …/lxc/{vmid}/config` with the GET's `digest` (a concurrent edit: `detected modified
        configuration - file changed by other user? Try again.`). Raw `lxc.*` keys cannot be set here."""
        params = {**values, "delete": ",".join(delete) or None, "digest": digest}
        self._write("PUT", f"/nodes/{node}/lxc/{vmid}/config", params)

    def create_lxc(self, node: str, vmid: int, config: Params) -> str:
        """`POST /nodes/{node}/lxc`; returns the UPID (creation runs as a task)."""
        return self._task("POST", f"/nodes/{node}/lxc", {"vmid": vmid, **config})

    def start_lxc(self, node: str, vmid: int) -> str:
        """`POST …/lxc/{vmid}/status/start`; returns the UPID (`CT <vmid> already running` before one)."""
        return self._task("POST", f"/nodes/{node}/lxc/{vmid}/status/start", {})

    def stop_lxc(self, node: str, vmid: int) -> str:
        """`POST …/lxc/{vmid}/status/stop`; returns the UPID (`CT <vmid> not running` before one)."""
        return self._task("POST", f"/nodes/{node}/lxc/{vmid}/status/stop", {})

    def shutdown_lxc(self, node: str, vmid: int, timeout_s: int) -> str:
        """`POST …/lxc/{vmid}/status/shutdown` (a clean shutdown, lxc-stop(1)) with `timeout`; returns the
        UPID (`CT <vmid> not running` before one; the task fails when it still runs after `timeout_s`)."""
        return self._task("POST", f"/nodes/{node}/lxc/{vmid}/status/shutdown", {"timeout": timeout_s})

    def lxc_status(self, node: str, vmid: int) -> str:
        """`GET …/lxc/{vmid}/status/current`: `running` or `stopped`."""
        return self._read(
            f"/nodes/{node}/lxc/{vmid}/status/current", {}, lambda data: _text_of(data, "status")
        )

    # -- storage (cloud images and cloud-init snippets)
    def storage(self, storage: str) -> StorageConfig:
        """`GET /storage/{storage}`: its content types, its directory (dir-like storages) and `digest`."""

        def parse(data: object) -> StorageConfig:
            values = _dict(data)
            path = values.get("path")
            if path is not None and _UNSAFE_PATH.search(str(path)):
                refused = PveError(
                    502,
                    f"storage {storage}: path {str(path)!r} holds a character pvegpu will not put in a "
                    "command",
                )
                refused.endpoint = f"GET /storage/{storage}"
                raise refused
            return StorageConfig(
                storage=storage,
                content=tuple(c for c in _text_of(values, "content").split(",") if c),
                path=None if path is None else str(path),
                digest=_text_of(values, "digest"),
                type=str(values.get("type", "")),
                shared=values.get("shared") in (1, "1", True),
            )

        return self._read(f"/storage/{storage}", {}, parse)

    def update_storage_content(self, storage: str, content: Sequence[str], digest: str) -> None:
        """`PUT /storage/{storage}` with `content` (the whole list) and the read's `digest`; Proxmox answers
        `{"storage": ..., "type": ...}` (read back: that proves nothing)."""
        self._call("PUT", f"/storage/{storage}", {"content": ",".join(content), "digest": digest})

    def storage_volumes(self, node: str, storage: str, content: str) -> tuple[str, ...]:
        """`GET /nodes/{node}/storage/{storage}/content?content=…`: the volume ids of that content type."""

        def parse(data: object) -> tuple[str, ...]:
            return tuple(_text_of(item, "volid") for item in _list(data))

        path = f"/nodes/{node}/storage/{storage}/content"
        return self._read(path, {"content": content}, parse)

    def guest_volumes(self, node: str, storage: str, vmid: int) -> tuple[StorageVolume, ...]:
        """`GET /nodes/{node}/storage/{storage}/content?vmid=…`: the volumes guest `vmid` owns there, each
        with its `ctime` when the plugin reports one (pve-storage API2/Storage/Content.pm `index`: only the
        volumes the identity may access, Datastore.Allocate or Datastore.Audit with VM.Config.Disk)."""

        def parse(data: object) -> tuple[StorageVolume, ...]:
            found = []
            for item in _list(data):
                values = _dict(item)
                owner, ctime = values.get("vmid"), values.get("ctime")
                if owner is not None and not isinstance(owner, int):
                    raise _ShapeError("an integer 'vmid'")
                if ctime is not None and not isinstance(ctime, int):
                    raise _ShapeError("an integer 'ctime'")
                found.append(StorageVolume(_text_of(values, "volid"), owner, ctime))
            return tuple(found)

        return self._read(f"/nodes/{node}/storage/{storage}/content", {"vmid": vmid}, parse)

    def delete_volume(self, node: str, storage: str, volid: str) -> str:
        """`DELETE /nodes/{node}/storage/{storage}/content/{volid}` (the volid whole: the content subclass
        takes the rest of the path, slashes included, pve-storage API2/Storage/Status.pm); returns the UPID
        of its `imgdel` task. Needs Datastore.Allocate on `/storage/{storage}`."""
        return self._task("DELETE", f"/nodes/{node}/storage/{storage}/content/{volid}", {})

    def download_url(self, node: str, storage: str, params: Params) -> str:
        """`POST /nodes/{node}/storage/{storage}/download-url`; returns the UPID (a checksum mismatch fails
        the task)."""
        return self._task("POST", f"/nodes/{node}/storage/{storage}/download-url", params)

    def resize_vm_disk(self, node: str, vmid: int, disk: str, size: str, digest: str) -> None:
        """`PUT …/qemu/{vmid}/resize` (`size` absolute, e.g. `32G`; Proxmox refuses to shrink)."""
        params = {"disk": disk, "size": size, "digest": digest}
        data = self._call("PUT", f"/nodes/{node}/qemu/{vmid}/resize", params)
        if data is not None and not isinstance(data, Unparsed) and not isinstance(data, str):
            raise _response_error(f"PUT /nodes/{node}/qemu/{vmid}/resize", "no data or a task id", data)
        if isinstance(data, str) and UPID.fullmatch(data):
            self.wait_task(data, 600)

    def guest_addresses(self, node: str, vmid: int) -> tuple[GuestInterface, ...]:
        """`GET …/qemu/{vmid}/agent/network-get-interfaces`: each interface's name, MAC and addresses (a
        PveError while the guest agent is not running)."""

        def parse(data: object) -> tuple[GuestInterface, ...]:
            found = []
            for item in _list(_dict(data)["result"]):
                values = _dict(item)
                addresses = tuple(
                    f"{_text_of(a, 'ip-address')}/{_dict(a).get('prefix', '')}"
                    for a in _list(values.get("ip-addresses", []))
                    if _dict(a).get("ip-address-type") == "ipv4"
                )
                mac = values.get("hardware-address")
                found.append(GuestInterface(_text_of(values, "name"), str(mac or ""), addresses))
            return tuple(found)

        return self._read(f"/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", {}, parse)

    # -- tasks
    def task_status(self, upid: str) -> TaskStatus:
        """`GET /nodes/{node}/tasks/{upid}/status`, the node taken from the UPID."""

        def parse(data: object) -> TaskStatus:
            exitstatus = _dict(data).get("exitstatus")
            return TaskStatus(
                upid=upid,
                status=_text_of(data, "status"),
                exitstatus=None if exitstatus is None else str(exitstatus),
            )

        return self._read(f"/nodes/{upid_node(upid)}/tasks/{upid}/status", {}, parse)

    def task_log(self, upid: str) -> tuple[str, ...]:
        """`GET /nodes/{node}/tasks/{upid}/log` with `limit=0` (every line): the task log's lines, in order
        (what the task printed: a failed VM start's QEMU error lines, then `TASK ERROR: ...`)."""

        def parse(data: object) -> tuple[str, ...]:
            return tuple(str(_dict(item).get("t", "")) for item in _list(data))

        return self._read(f"/nodes/{upid_node(upid)}/tasks/{upid}/log", {"start": 0, "limit": 0}, parse)

    def guest_tasks(self, node: str, vmid: int, limit: int = 10) -> tuple[TaskStatus, ...]:
        """`GET /nodes/{node}/tasks` of guest `vmid`, newest first: each one's status (`running`, or
        `stopped` with its exit status, e.g. `unexpected status` for a worker that was killed)."""

        def parse(data: object) -> tuple[TaskStatus, ...]:
            tasks = []
            for item in _list(data):
                values = _dict(item)
                ended = values.get("endtime") is not None
                tasks.append(
                    TaskStatus(
                        upid=_text_of(values, "upid"),
                        status="stopped" if ended else "running",
                        exitstatus=_text_of(values, "status") if ended else None,
                    )
                )
            return tuple(tasks)

        params: Params = {"vmid": vmid, "source": "all", "limit": limit}
        return self._read(f"/nodes/{node}/tasks", params, parse)

    def wait_task(
        self,
        upid: str,
        timeout: float,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> TaskStatus:
        """Poll the task until it stops; return its status when it succeeded: `exitstatus` `OK` or
        `WARNINGS: N` (pve-common src/PVE/UPID.pm `status_is_error`: it logged warnings and did its job).

        Raises TaskFailedError with any other exitstatus and TaskTimeoutError when it is still running after
        `timeout` seconds.
        """
        ended: list[TaskStatus] = []

        def running() -> str | None:
            status = self.task_status(upid)
            if status.status != "stopped":
                return status.status
            ended.append(status)
            return None

        try:
            wait_until(
                running, timeout, f"task {upid} still running", interval_s=interval, clock=clock, sleep=sleep
            )
        except WaitTimeoutError:
            timed_out = TaskTimeoutError(upid, timeout)
            timed_out.endpoint = f"task {upid}"
            raise timed_out from None
        status = ended[0]
        if not status.ok:
            failed = TaskFailedError(upid, status.exitstatus or "task stopped without an exit status")
            failed.endpoint = f"task {upid}"
            raise failed
        return status


_T = TypeVar("_T")


# pve-storage (src/PVE/Storage/Plugin.pm, verify_path) takes any path of `/` and one character other than `;`,
# `(`, `)` ("fixme: exclude more shell meta characters?"); a storage's directory reaches commands on the node
# (snippets, the hookscript), so what a shell or a line-based read could take for syntax is refused.
_UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f`$\\\"']")


class _ShapeError(ValueError):
    """Data of the wrong JSON shape; `expected` says what was wanted (`a list`)."""

    def __init__(self, expected: str) -> None:
        self.expected = expected
        super().__init__(expected)


def _response_error(endpoint: str, expected: str, got: object) -> PveResponseError:
    error = PveResponseError(expected, got)
    error.endpoint = endpoint
    return error


def upid_node(upid: str) -> str:
    """The node field of a UPID (`UPID:<node>:…`); ValueError when `upid` is not one."""
    match = UPID.fullmatch(upid)
    if match is None:
        raise ValueError(f"{upid!r} is not a Proxmox task id (UPID)")
    return match["node"]


def _mapping_params(mapping: PciMapping) -> dict[str, Value | None]:
    def bit(value: bool | None) -> int | None:
        return None if value is None else int(value)

    return {
        "map": list(mapping.map),
        "description": mapping.description,
        "mdev": bit(mapping.mdev),
        "live-migration-capable": bit(mapping.live_migration_capable),
    }


def _mapping_state(item: object, *, checked: bool) -> MappingState:
    data = _dict(item)
    description = data.get("description")
    mapping = PciMapping(
        id=_text_of(data, "id"),
        map=tuple(_strings(data.get("map", []))),
        description=None if description is None else str(description),
        mdev=_flag(data.get("mdev")),
        live_migration_capable=_flag(data.get("live-migration-capable")),
    )
    checks = None
    if checked:
        checks = tuple(
            MappingCheck(Severity(_text_of(c, "severity")), _text_of(c, "message"))
            for c in _list(data.get("checks", []))
        )
    return MappingState(mapping=mapping, digest=_text_of(data, "digest"), checks=checks)


def _vm_status(data: object) -> VmStatus:
    values = _dict(data)
    qmp, name = values.get("qmpstatus"), values.get("name")
    vmid = values["vmid"]
    if not isinstance(vmid, int | str) or not str(vmid).isdigit():
        raise _ShapeError("an integer 'vmid'")
    return VmStatus(
        vmid=int(vmid),
        status=_text_of(values, "status"),
        qmpstatus=None if qmp is None else str(qmp),
        name=None if name is None else str(name),
    )


def _flag(value: object) -> bool | None:
    return None if value is None else str(value) == "1"


def _guest_config(data: object) -> GuestConfig:
    values = dict(_dict(data))
    digest = values.pop("digest", None)
    if not isinstance(digest, str):
        raise _ShapeError("a config with a 'digest'")
    return GuestConfig(values=values, digest=digest)


def _text_of(data: object, key: str) -> str:
    """`data[key]` of an object, which must be a string (KeyError when absent)."""
    value = _dict(data)[key]
    if not isinstance(value, str):
        raise _ShapeError(f"a string {key!r}")
    return value


def _strings(data: object) -> list[str]:
    items = _list(data)
    if not all(isinstance(item, str) for item in items):
        raise _ShapeError("a list of strings")
    return [str(item) for item in items]


def _dict(data: object) -> dict[str, object]:
    if not isinstance(data, dict):
        raise _ShapeError("an object")
    return {str(key): value for key, value in data.items()}


def _list(data: object) -> list[object]:
    if not isinstance(data, list):
        raise _ShapeError("a list")
    return list(data)
