"""A small typed interface to the Proxmox VE API, over proxmoxer 2.3.0.

Backends (`connect_https`, `connect_ssh`, `connect_local`):

- `https`: proxmoxer's requests backend with an API token (`user@realm!name` + secret). TLS is verified
  against the system CAs by default, or against `ca_file`; with `fingerprint` (the node's
  `AA:BB:…` SHA-256, as `pvenode cert info` prints it) the certificate is pinned instead. There is no
  option to skip verification.
- `ssh`: proxmoxer's paramiko session runs `pvesh` on the node. The host key must already be known
  (system known_hosts or `known_hosts`): an unknown key is refused, never added.
- `local`: proxmoxer's local session runs `pvesh` on this node.

The command backends build the `pvesh` argv here rather than through proxmoxer's flattening, which sends a
list as ONE argument (`-map "['a', 'b']"`, an invalid mapping): every list value becomes a repeated option
(`--map A --map B`), booleans `1`/`0`. pvesh runs async calls to completion, prints worker output then the
UPID, and exits 0 even when the task failed (shared/knowledge/proxmox-api-behaviour.md §0.1): the task's
`exitstatus` is the only truth, so every UPID is waited for (`wait_task`).

Every API failure raises `PveError` carrying Proxmox's status and message verbatim.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import paramiko
from proxmoxer import ProxmoxAPI, ResourceException
from proxmoxer.backends.local import LocalSession
from proxmoxer.backends.ssh_paramiko import SshParamikoSession
from requests.adapters import HTTPAdapter
from requests.exceptions import RequestException

from pvegpu.models.pve import (
    GuestConfig,
    MappingCheck,
    MappingState,
    PciMapping,
    Severity,
    TaskStatus,
    VmStatus,
)
from pvegpu.wait import WaitTimeoutError, wait_until

Method = Literal["GET", "POST", "PUT", "DELETE"]
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
    `message` Proxmox's text, `errors` the per-parameter messages of a 400."""

    def __init__(self, status: int, message: str, errors: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.message = message
        self.errors = dict(errors or {})
        lines = [f"{status} {message}", *(f"{key}: {text}" for key, text in sorted(self.errors.items()))]
        super().__init__("\n".join(lines))


class PveConnectionError(PveError):
    """The API could not be reached (TLS refused, connection failed); `message` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class TaskFailedError(PveError):
    """A task ended with an exitstatus other than OK; `message` is the exitstatus, `upid` the task."""

    def __init__(self, upid: str, exitstatus: str) -> None:
        self.upid = upid
        super().__init__(500, exitstatus)


class TaskTimeoutError(PveError):
    """A task was still running when the wait's timeout ran out."""

    def __init__(self, upid: str, timeout: float) -> None:
        self.upid = upid
        super().__init__(504, f"task {upid} still running after {timeout:g} s")


class Transport(Protocol):
    """One API call: returns the `data` of the response (None for calls that return nothing)."""

    def __call__(self, method: Method, path: str, params: Params) -> object: ...


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
            argv += [f"--{key}", _text(item)]
    return [*argv, "--output-format", "json"]


def _text(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def parse_pvesh_output(stdout: str, stderr: str, exit_code: int) -> object:
    """The result of a pvesh run: the JSON after any worker/handler output lines, None when it printed none.

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
    return None


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
        stdout, stderr, exit_code = self.runner(pvesh_argv(method, path, params, sudo=self.sudo))
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
            )
        except BaseException:
            client.close()  # paramiko leaves the transport open on a refused key or login
            raise
        return client


def connect_ssh(
    host: str,
    user: str = "root",
    *,
    port: int = 22,
    key_filename: str | None = None,
    known_hosts: str | None = None,
    sudo: bool = False,
    timeout: float = 30,
) -> PveClient:
    """A client running `pvesh` on `host` over SSH (paramiko). The host key must be in the system
    known_hosts or in `known_hosts`; otherwise PveConnectionError, nothing is added."""
    try:
        session = _KnownHostsSession(
            known_hosts, host=host, user=user, private_key_file=key_filename, port=port, timeout=timeout
        )
    except (paramiko.SSHException, OSError) as error:
        raise PveConnectionError(f"ssh {user}@{host}:{port}: {error}") from None

    def run(argv: list[str]) -> tuple[str, str, int]:
        stdout, stderr, exit_code = session._exec(argv)  # type: ignore[no-untyped-call]
        return str(stdout), str(stderr), int(exit_code)

    return PveClient(CommandTransport(run, sudo=sudo))


def connect_local(*, sudo: bool = False, timeout: float = 600) -> PveClient:
    """A client running `pvesh` on this node (proxmoxer's local session); `timeout` bounds one call,
    which under pvesh includes a whole task."""
    session = LocalSession(timeout=timeout)  # type: ignore[no-untyped-call]

    def run(argv: list[str]) -> tuple[str, str, int]:
        stdout, stderr, exit_code = session._exec(argv)  # type: ignore[no-untyped-call]
        return str(stdout), str(stderr), int(exit_code)

    return PveClient(CommandTransport(run, sudo=sudo))


# ---------------------------------------------------------------------------------------------- https


class _PinnedAdapter(HTTPAdapter):
    """Accept exactly the certificate whose SHA-256 fingerprint is given (urllib3 checks it on connect)."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        super().__init__()

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **kwargs: Any) -> None:
        kwargs["assert_fingerprint"] = self.fingerprint
        super().init_poolmanager(connections, maxsize, block, **kwargs)


@dataclass
class HttpsTransport:
    """Calls through proxmoxer's https backend (`api`), errors rewritten as PveError."""

    api: Any = field(repr=False)

    def __call__(self, method: Method, path: str, params: Params) -> object:
        values = {key: _form(value) for key, value in params.items() if value is not None}
        call = getattr(self.api(path.lstrip("/")), method.lower())  # get/post/put/delete
        try:
            return call(**values)
        except ResourceException as error:
            errors = error.errors if isinstance(error.errors, dict) else None
            raise PveError(int(error.status_code), str(error.content), errors) from None
        except RequestException as error:
            raise PveConnectionError(f"{self.api._store['base_url']}: {error}") from None


def _form(value: Value) -> str | list[str]:
    if isinstance(value, str | int | bool):
        return _text(value)
    return [str(item) for item in value]  # requests sends a list as the key repeated: map=a&map=b


_FINGERPRINT = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){31}")


def connect_https(
    host: str,
    token_id: str,
    token_secret: str,
    *,
    port: int = 8006,
    ca_file: str | None = None,
    fingerprint: str | None = None,
    timeout: float = 30,
) -> PveClient:
    """A client for `https://host:port/api2/json` with the API token `token_id` (`user@realm!name`).

    TLS: verified against the system CAs, or `ca_file`; or, with `fingerprint` (SHA-256, `AA:BB:…`),
    only that certificate is accepted. Raises ValueError for a malformed token id or fingerprint.
    """
    user, sep, token_name = token_id.partition("!")
    if not sep or "@" not in user or not token_name:
        raise ValueError(f"API token id {token_id!r} is not user@realm!name")
    if fingerprint is not None and not _FINGERPRINT.fullmatch(fingerprint):
        raise ValueError(
            f"fingerprint {fingerprint!r} is not a SHA-256 fingerprint (32 colon-separated hex pairs)"
        )
    verify: bool | str = False if fingerprint is not None else (ca_file or True)
    api = ProxmoxAPI(  # type: ignore[no-untyped-call]
        host,
        backend="https",
        user=user,
        token_name=token_name,
        token_value=token_secret,
        port=port,
        verify_ssl=verify,
        timeout=timeout,
    )
    if fingerprint is not None:
        # CA checks are replaced by the pin, never dropped: urllib3 refuses any other certificate.
        api._store["session"].mount("https://", _PinnedAdapter(fingerprint))
    return PveClient(HttpsTransport(api))


# ---------------------------------------------------------------------------------------------- client


@dataclass(frozen=True)
class PveClient:
    """The API calls pvegpu makes. Paths and parameters are Proxmox's (proxmox-api-behaviour.md)."""

    call: Transport

    # -- cluster PCI mappings
    def mappings(self, check_node: str | None = None) -> tuple[MappingState, ...]:
        """`GET /cluster/mapping/pci`; with `check_node`, each mapping's checks for that node."""
        data = self.call("GET", "/cluster/mapping/pci", {"check-node": check_node})
        return tuple(_mapping_state(item, checked=check_node is not None) for item in _list(data))

    def mapping(self, mapping_id: str) -> MappingState | None:
        """`GET /cluster/mapping/pci/{id}`, None when Proxmox says `mapping '<id>' not found`."""
        try:
            data = self.call("GET", f"/cluster/mapping/pci/{mapping_id}", {})
        except PveError as error:
            if error.message == f"mapping '{mapping_id}' not found":
                return None
            raise
        return _mapping_state({**_dict(data), "id": mapping_id}, checked=False)

    def create_mapping(self, mapping: PciMapping) -> None:
        """`POST /cluster/mapping/pci` (`pci ID '<id>' already defined` when it exists)."""
        self.call("POST", "/cluster/mapping/pci", {"id": mapping.id, **_mapping_params(mapping)})

    def update_mapping(self, mapping: PciMapping, digest: str) -> None:
        """`PUT /cluster/mapping/pci/{id}` with the whole `map` and the `digest` of the GET it is based on:
        a concurrent edit fails with Proxmox's `detected modified configuration` error, nothing written."""
        params = {**_mapping_params(mapping), "digest": digest}
        self.call("PUT", f"/cluster/mapping/pci/{mapping.id}", params)

    def delete_mapping(self, mapping_id: str) -> None:
        """`DELETE /cluster/mapping/pci/{id}` (a missing id is not an error)."""
        self.call("DELETE", f"/cluster/mapping/pci/{mapping_id}", {})

    # -- qemu
    def create_vm(self, node: str, vmid: int, config: Params) -> str:
        """`POST /nodes/{node}/qemu`; returns the UPID (wait for it: creation runs as a task)."""
        return _upid(self.call("POST", f"/nodes/{node}/qemu", {"vmid": vmid, **config}))

    def vm_config(self, node: str, vmid: int) -> GuestConfig:
        """`GET …/qemu/{vmid}/config` with pending values applied, plus its `digest`."""
        return _guest_config(self.call("GET", f"/nodes/{node}/qemu/{vmid}/config", {}))

    def update_vm_config(
        self, node: str, vmid: int, values: Params, digest: str, delete: Sequence[str] = ()
    ) -> None:
        """`PUT …/qemu/{vmid}/config` (synchronous) with the GET's `digest`: a concurrent edit fails with
        `checksum mismatch (file change by other user?)`. `delete` removes keys."""
        params = {**values, "delete": ",".join(delete) or None, "digest": digest}
        self.call("PUT", f"/nodes/{node}/qemu/{vmid}/config", params)

    def start_vm(self, node: str, vmid: int) -> str:
        """`POST …/status/start`; returns the UPID. A failed start (e.g. an invalid mapping) still returns
        one: `wait_task` raises with the task's exitstatus."""
        return _upid(self.call("POST", f"/nodes/{node}/qemu/{vmid}/status/start", {}))

    def stop_vm(self, node: str, vmid: int) -> str:
        """`POST …/status/stop`; returns the UPID (stopping a stopped VM succeeds)."""
        return _upid(self.call("POST", f"/nodes/{node}/qemu/{vmid}/status/stop", {}))

    def vm_status(self, node: str, vmid: int) -> VmStatus:
        """`GET …/qemu/{vmid}/status/current`."""
        data = _dict(self.call("GET", f"/nodes/{node}/qemu/{vmid}/status/current", {}))
        qmp, name = data.get("qmpstatus"), data.get("name")
        return VmStatus(
            vmid=int(str(data["vmid"])),
            status=str(data["status"]),
            qmpstatus=None if qmp is None else str(qmp),
            name=None if name is None else str(name),
        )

    # -- lxc
    def lxc_config(self, node: str, vmid: int) -> GuestConfig:
        """`GET …/lxc/{vmid}/config` (raw `lxc.*` lines under the key `lxc`), plus its `digest`."""
        return _guest_config(self.call("GET", f"/nodes/{node}/lxc/{vmid}/config", {}))

    def update_lxc_config(
        self, node: str, vmid: int, values: Params, digest: str, delete: Sequence[str] = ()
    ) -> None:
        """`PUT …/lxc/{vmid}/config` with the GET's `digest` (a concurrent edit: `detected modified
        configuration - file changed by other user? Try again.`). Raw `lxc.*` keys cannot be set here."""
        params = {**values, "delete": ",".join(delete) or None, "digest": digest}
        self.call("PUT", f"/nodes/{node}/lxc/{vmid}/config", params)

    def create_lxc(self, node: str, vmid: int, config: Params) -> str:
        """`POST /nodes/{node}/lxc`; returns the UPID (creation runs as a task)."""
        return _upid(self.call("POST", f"/nodes/{node}/lxc", {"vmid": vmid, **config}))

    def start_lxc(self, node: str, vmid: int) -> str:
        """`POST …/lxc/{vmid}/status/start`; returns the UPID (`CT <vmid> already running` before one)."""
        return _upid(self.call("POST", f"/nodes/{node}/lxc/{vmid}/status/start", {}))

    def stop_lxc(self, node: str, vmid: int) -> str:
        """`POST …/lxc/{vmid}/status/stop`; returns the UPID (`CT <vmid> not running` before one)."""
        return _upid(self.call("POST", f"/nodes/{node}/lxc/{vmid}/status/stop", {}))

    def lxc_status(self, node: str, vmid: int) -> str:
        """`GET …/lxc/{vmid}/status/current`: `running` or `stopped`."""
        return str(_dict(self.call("GET", f"/nodes/{node}/lxc/{vmid}/status/current", {}))["status"])

    # -- tasks
    def task_status(self, upid: str) -> TaskStatus:
        """`GET /nodes/{node}/tasks/{upid}/status`, the node taken from the UPID."""
        data = _dict(self.call("GET", f"/nodes/{upid_node(upid)}/tasks/{upid}/status", {}))
        exitstatus = data.get("exitstatus")
        return TaskStatus(
            upid=upid, status=str(data["status"]), exitstatus=None if exitstatus is None else str(exitstatus)
        )

    def wait_task(
        self,
        upid: str,
        timeout: float,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> TaskStatus:
        """Poll the task until it stops; return its status when `exitstatus` is `OK`.

        Raises TaskFailedError with the exitstatus (`WARNINGS: N` included: it is not `OK`) and
        TaskTimeoutError when it is still running after `timeout` seconds.
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
            raise TaskTimeoutError(upid, timeout) from None
        status = ended[0]
        if status.exitstatus != "OK":
            raise TaskFailedError(upid, status.exitstatus or "task stopped without an exit status")
        return status


def upid_node(upid: str) -> str:
    """The node field of a UPID (`UPID:<node>:…`); ValueError when `upid` is not one."""
    match = UPID.fullmatch(upid)
    if match is None:
        raise ValueError(f"{upid!r} is not a Proxmox task id (UPID)")
    return match["node"]


def _upid(data: object) -> str:
    if not isinstance(data, str):
        raise PveError(500, f"expected a task id (UPID), got {data!r}")
    upid_node(data)
    return data


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
        id=str(data["id"]),
        map=tuple(str(entry) for entry in _list(data.get("map", []))),
        description=None if description is None else str(description),
        mdev=_flag(data.get("mdev")),
        live_migration_capable=_flag(data.get("live-migration-capable")),
    )
    checks = None
    if checked:
        checks = tuple(
            MappingCheck(Severity(str(_dict(c)["severity"])), str(_dict(c)["message"]))
            for c in _list(data.get("checks", []))
        )
    return MappingState(mapping=mapping, digest=str(data["digest"]), checks=checks)


def _flag(value: object) -> bool | None:
    return None if value is None else str(value) == "1"


def _guest_config(data: object) -> GuestConfig:
    values = dict(_dict(data))
    digest = values.pop("digest", None)
    if not isinstance(digest, str):
        raise PveError(500, "config without a digest")
    return GuestConfig(values=values, digest=digest)


def _dict(data: object) -> dict[str, object]:
    if not isinstance(data, dict):
        raise PveError(500, f"expected an object, got {data!r}")
    return {str(key): value for key, value in data.items()}


def _list(data: object) -> list[object]:
    if not isinstance(data, list):
        raise PveError(500, f"expected a list, got {data!r}")
    return list(data)
