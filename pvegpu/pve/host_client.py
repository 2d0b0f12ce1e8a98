"""The Proxmox API of the node being deployed, as operations observe it: a `PveClient` per host.

Why not pyinfra facts: a fact is a shell command run over the host's connection, but the `https` backend
never runs a command on the host, and the API's answers (a digest, task ids) are only meaningful to the
same client that then writes. So operations read the API through `pve_client(host)` while they are
prepared (when pyinfra reads facts), diff, and yield `FunctionCommand`s that write through the same client
when pyinfra executes; `--dry` prepares without executing, so it reads but never writes.

`pve_client` builds the client from the host's `pve` data (`PveApiSpec`), falling back to the host's own
SSH settings for the `ssh` backend, and caches one per host for the run. The token secret is read from
its file on this machine, which must meet the rules of a secret file (`pvegpu.models.secret_file`: regular,
owned by root or the user running pyinfra, mode 0600 or stricter, one non-empty line), else refused; the
secret is never logged or put in an error message.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gevent
from gevent.event import AsyncResult

from pvegpu.facts.secret_files import read_local_secret
from pvegpu.models.pve_api import PVE_KEY, PveApiSpec
from pvegpu.models.secret_file import secret_file_problems
from pvegpu.models.spec_validation import spec_of
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.pve.transport import CommandTransport, Method, Params, RootRouted, Transport, acts_as

_CLIENTS: dict[str, PveClient] = {}


class PveSetupError(ValueError):
    """The `pve` data cannot give a client (no address, an unsafe token file); the message says why."""


def api_spec(data: Any) -> PveApiSpec:
    """The host's validated `pve` spec (defaults when absent); `data` is `host.data`."""
    return spec_of(data, PVE_KEY, PveApiSpec)


def read_token(path: str) -> str:
    """The secret in `path` (`pve.token_file`), its final newline removed.

    Raises PveSetupError, one `pve.token_file: <path> ...` line per broken rule (module docstring), naming
    the file, never the secret."""
    try:
        observed, content = read_local_secret(path)
    except OSError as error:
        raise PveSetupError(f"pve.token_file: {path} cannot be read: {error.strerror or error}") from None
    problems = secret_file_problems("pve.token_file", observed, for_sglang=False, operator_uid=os.getuid())
    if problems:
        raise PveSetupError("\n".join(problems))
    return content.decode("ascii").removesuffix("\n")  # the rules let one line of visible ASCII through


def connect(spec: PveApiSpec, data: Any, host_name: str | None = None) -> PveClient:
    """A new client for `spec`; `data` (host data) supplies the SSH defaults, and `host_name` (pyinfra's
    host name) the address when the data has no `ssh_hostname`, as pyinfra's SSH connector takes it.

    `https` with `root_ssh` (the default): the token sends every call but those only root@pam may send,
    which go through root's `pvesh` on the node over the host's SSH (`RootRouted`, connected on first
    need). `root_ssh: false`: the token alone (inventory validation refused what needs root)."""
    if spec.backend == "local":
        from pvegpu.pve.local import connect_local  # noqa: PLC0415 (proxmoxer: only when used)

        return connect_local(sudo=spec.sudo)
    hostname = spec.hostname or data.get("ssh_hostname") or host_name
    if not hostname:
        raise PveSetupError("pve.hostname: not set, and the host has no ssh_hostname")
    if spec.backend == "https":
        assert spec.token_id is not None  # the model requires both for https
        assert spec.token_file is not None
        secret = read_token(spec.token_file)  # refused now, before any host is touched
        token_id, port = spec.token_id, spec.port or 8006
        token = FirstCall(
            lambda: _connect_https(hostname, token_id, secret, port, spec).call,
            token_id,
        )
        if not spec.root_ssh:
            return PveClient(token)
        ssh_hostname = data.get("ssh_hostname") or host_name or hostname  # where pyinfra's SSH goes
        return PveClient(RootRouted(token, token_id, lambda: _ssh(spec, data, ssh_hostname, ssh_port=None)))
    return PveClient(_ssh(spec, data, hostname, ssh_port=spec.port))


def _connect_https(hostname: str, token_id: str, secret: str, port: int, spec: PveApiSpec) -> PveClient:
    # requests and proxmoxer are imported here, at the first call, not when the client is made
    from pvegpu.pve.https import connect_https  # noqa: PLC0415

    return connect_https(
        hostname, token_id, secret, port=port, ca_file=spec.ca_file, fingerprint=spec.fingerprint
    )


@dataclass
class FirstCall:
    """The token's transport, made at its first call: a run whose reads the node's state answered (a no-op
    run) imports and builds nothing of the https backend (requests, proxmoxer: ~50 ms of CPU a run).
    `identity` is the token id the calls act as."""

    make: Callable[[], Transport]
    identity: str
    _made: Transport | None = field(default=None, init=False, repr=False)

    def __call__(self, method: Method, path: str, params: Params) -> object:
        if self._made is None:
            self._made = self.make()
        return self._made(method, path, params)

    def acts_as(self, method: Method, path: str, params: Params) -> str:
        del method, path, params
        return self.identity


def _ssh(spec: PveApiSpec, data: Any, hostname: str, ssh_port: int | None) -> CommandTransport:
    """root's `pvesh` on the node over SSH, with `pve`'s SSH settings or else the host's own. proxmoxer's
    session is imported here: an https run that writes no root-only key never needs it."""
    from pvegpu.pve.ssh import ssh_transport  # noqa: PLC0415

    return ssh_transport(
        hostname,
        spec.ssh_user or data.get("ssh_user") or "root",
        port=ssh_port or int(data.get("ssh_port") or 22),
        key_filename=spec.ssh_key or data.get("ssh_key"),
        known_hosts=spec.known_hosts or data.get("ssh_known_hosts_file"),
        sudo=spec.sudo,
    )


def pve_client(host: Any) -> PveClient:
    """The cached client of pyinfra `host`: one connection per host and run, its resource reads shared
    (`shared_reads`)."""
    client = _CLIENTS.get(host.name)
    if client is None:
        client = _CLIENTS[host.name] = shared_reads(connect(api_spec(host.data), host.data, host.name))
    return client


# What only a write changes: a guest's config, the PCI mappings, a storage's config. A status or a task
# changes by itself.
_SHARED = re.compile(r"/cluster/mapping/pci(/[^/]+)?|/nodes/[^/]+/(qemu|lxc)/\d+/config|/storage/[^/]+")


def shared_reads(client: PveClient) -> PveClient:
    """`client`, each read of a config or of the PCI mappings sent once per path and parameters until the
    client writes: the operations of a run that need one resource (the VM config: the config and the start
    operations) share one read, its answer or its PveError, with its digest.

    Any write (POST, PUT, DELETE) drops every shared answer, so what follows a write reads it back. Status
    and task reads go to Proxmox (waits poll them), except that the first read of one that `read_ahead` sent
    takes its answer. A concurrent edit by someone else is caught as before: every write carries the digest of
    the read it was diffed against.
    """
    return replace(client, call=_SharedReads(client.call))


def read_ahead(client: PveClient, reads: Sequence[Callable[[PveClient], object]]) -> None:
    """Send `reads` (e.g. `lambda api: api.vm_config(node, vmid)`) at once, each in its own greenlet, on a
    client from `shared_reads`: the run's first identical read waits for that answer instead of sending its
    own, so a run's API reads cost one round trip together, not one each. A write before an answer comes drops
    it (what follows a write reads again); a read already answered or on its way is not sent again. What a
    read raises is raised to the read that takes its answer. Any other client: nothing is sent."""
    shared = client.call
    if not isinstance(shared, _SharedReads):
        return
    ahead = replace(client, call=shared.ahead)
    for read in reads:
        gevent.spawn(_quietly, read, ahead)
    # Each read starts, and says what it reads, before this greenlet reads anything itself.
    gevent.sleep(0)


def seed(client: PveClient, read: Callable[[PveClient], object], answer: object) -> bool:
    """Keep `answer` (the API's JSON for the GET that `read` sends, e.g. `lambda api: api.vm_config(node,
    vmid)`) as that read's answer on a client from `shared_reads`, as if it had been read: the run's reads
    of it take it until the client writes. True when kept; False (nothing kept) for any other client, a
    read already answered or on its way, a GET of a status or task (never shared), or an answer the read's
    parser refuses."""
    shared = client.call
    if not isinstance(shared, _SharedReads):
        return False
    sent: list[str] = []

    def capture(method: Method, path: str, params: Params) -> object:
        sent.append(_key(path, params) if method == "GET" and _SHARED.fullmatch(path) else "")
        return copy.deepcopy(answer)

    try:
        read(replace(client, call=capture))
    except PveError:
        return False
    if len(sent) != 1 or not sent[0] or sent[0] in shared.answers or sent[0] in shared.early:
        return False
    shared.answers[sent[0]] = answer
    return True


def seed_status(
    client: PveClient, read: Callable[[PveClient], object], answer: object, fresh: Callable[[], bool]
) -> bool:
    """Keep `answer` (the API's JSON for a status GET that `read` sends, e.g. `lambda api: api.vm_status(node,
    vmid)`) for that read while `fresh()` says it still holds (the node's state read it came from is
    unchanged) and the client has not written: such reads take it; after, they ask Proxmox again. True when
    kept; False (nothing kept) for any other client, a read already answered or on its way, or an answer the
    read's parser refuses."""
    shared = client.call
    if not isinstance(shared, _SharedReads):
        return False
    sent: list[str] = []

    def capture(method: Method, path: str, params: Params) -> object:
        sent.append(_key(path, params) if method == "GET" else "")
        return copy.deepcopy(answer)

    try:
        read(replace(client, call=capture))
    except PveError:
        return False
    key = sent[0] if len(sent) == 1 else ""
    if not key or key in shared.answers or key in shared.early or key in shared.statuses:
        return False
    shared.statuses[key] = (answer, fresh)
    return True


def _quietly(read: Callable[[PveClient], object], client: PveClient) -> None:
    # The answer (or the error) is kept by `_SharedReads.ahead`; the read that takes it parses and raises.
    with contextlib.suppress(Exception):
        read(client)


@dataclass
class _SharedReads:
    call: Transport
    answers: dict[str, object] = field(default_factory=dict)
    early: dict[str, AsyncResult] = field(default_factory=dict)  # keys read ahead, not taken yet
    statuses: dict[str, tuple[object, Callable[[], bool]]] = field(default_factory=dict)  # seed_status
    writes: int = 0

    def __call__(self, method: Method, path: str, params: Params) -> object:
        key = _key(path, params)
        if method != "GET":
            self.answers.clear()
            self.early.clear()
            self.statuses.clear()
            self.writes += 1
            return self.call(method, path, params)
        shared = _SHARED.fullmatch(path) is not None
        seeded = self.statuses.get(key)
        if seeded is not None and seeded[1]():
            return copy.deepcopy(seeded[0])
        self.statuses.pop(key, None)
        if key in self.early:
            answer = self.early.pop(key).get()
            if isinstance(answer, Exception) and not isinstance(answer, PveError):
                raise answer  # not an API error (a broken transport): raised once, the next read sends
        elif shared and key in self.answers:
            answer = self.answers[key]
        else:
            try:
                answer = self.call(method, path, params)
            except PveError as error:
                answer = error
        if shared:
            self.answers[key] = answer
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)  # a caller may change what it got

    def acts_as(self, method: Method, path: str, params: Params) -> str:
        return acts_as(self.call, method, path, params)

    def ahead(self, method: Method, path: str, params: Params) -> object:
        """A GET sent ahead (`read_ahead`): its answer, or its error, kept for the first identical read."""
        key = _key(path, params)
        if method != "GET" or key in self.early or key in self.answers:
            return None
        result = AsyncResult()
        self.early[key] = result
        writes = self.writes
        try:
            answer = self.call(method, path, params)
        except Exception as error:
            answer = error
        if self.writes != writes:
            self.early.pop(key, None)  # a write came first: its readers read again
        result.set(answer)
        return None


def _key(path: str, params: Params) -> str:
    return repr((path, list(params.items())))
