"""Each host's state read, sent as soon as pyinfra connects to the host, with the command the same deploy's
last run read it with: the host answers while pyinfra imports and plans the deploy, not after.

pvegpu reads each host once per run (pvegpu/run/node_state.py, pvegpu/run/host_state.py), but only once the
deploy's roles are imported and the host's plan says what to read; on a no-op run that read was the longest
wait. `EarlyReads` is a pyinfra state callback (`State.add_callback_handler`), added by `pyinfra_transport`,
the transport factory that group_data/all.py gives pyinfra's SSH connections. At `host_connect` it sends the
command stored for this deploy and host, then wraps the connection's `exec_command` (paramiko's, which
pyinfra's SSH connector runs every command with):

- The first command pyinfra then runs there takes the early channel when its text is identical, as pyinfra
  would send it (same shell, same wrapping). The answer is what that command printed on this host, with
  nothing else run there in between: the answer pyinfra would have read, only earlier.
- Any other first command drops it (`Dropped the read sent ahead on <host>` in the debug log). The early
  command only read, and the run goes on as without it.

The command of pvegpu's state read is stored for the next run when it is the run's first on the host
(`recording`). It is kept per working directory, deploy files and host name in
`$XDG_CACHE_HOME/pvegpu/early-reads.json` (0600, the last `KEPT`). It holds paths and unit names, never a
secret: a key stays in its file on the host, and a host with a sudo or su password records nothing. A host
reached through another connector than SSH, a reconnection, and a deploy's first run send nothing ahead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import click
import paramiko
from paramiko import SSHException
from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, State
from pyinfra.context import ctx_state

from pvegpu.pve.nodelay import nodelay_transport

KEPT = 32  # reads stored, the most recently stored ones (each a few KB, read at every connect)
Streams = tuple[Any, Any, Any]  # paramiko's (stdin, stdout, stderr) of one `exec_command`


class _Connection:
    """One host's SSH connection in this run: the read sent ahead (if any), and whether the next command is
    the state read to store."""

    def __init__(self, key: str, sent: tuple[str, Streams] | None) -> None:
        self.key = key
        self.sent = sent
        self.recording = False
        self.ran = False  # whether a command ran on it yet


_CONNECTIONS: WeakKeyDictionary[State, dict[str, _Connection]] = WeakKeyDictionary()
_DEPLOYS: WeakKeyDictionary[State, str] = WeakKeyDictionary()
_STORED: WeakKeyDictionary[State, dict[str, str]] = WeakKeyDictionary()  # the file, read once per run


def cache_path() -> Path:
    """Where the commands are stored: `$XDG_CACHE_HOME/pvegpu/early-reads.json` (`~/.cache` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pvegpu" / "early-reads.json"


def _stored() -> dict[str, str]:
    try:
        stored = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {key: value for key, value in stored.items() if isinstance(value, str)}


def store_read(key: str, command: str) -> None:
    """Store `command` under `key`, atomically, in a file of this user's only (a failure only costs the
    speedup)."""
    stored = _stored()  # read again, not this run's copy: keeps what another run stored meanwhile
    if stored.get(key) == command:
        return
    stored.pop(key, None)
    stored[key] = command  # the newest last: the oldest go first beyond KEPT
    stored = dict(list(stored.items())[-KEPT:])
    path = cache_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump(stored, file)
        os.replace(temporary, path)
    except OSError as error:
        logger.debug("Could not store the state read for the next run in %s: %s", path, error)


def note_deploy() -> None:
    """Remember this pyinfra command's working directory and deploy files (the CLI's `operations`), which key
    the stored reads; from group_data/all.py, while pyinfra loads the inventory (click's context is the
    main greenlet's, not the connecting ones'). Nothing outside pyinfra's CLI."""
    context = click.get_current_context(silent=True)
    operations = None if context is None else context.params.get("operations")
    if operations and ctx_state.isset():  # type: ignore[no-untyped-call]
        deploy = [os.getcwd(), [str(operation) for operation in operations]]
        _DEPLOYS[ctx_state.get()] = json.dumps(deploy)  # type: ignore[no-untyped-call]


def deploy_key(state: State, host_name: str) -> str | None:
    """The key of `host_name`'s read in this pyinfra command (`note_deploy`); None when it has none."""
    deploy = _DEPLOYS.get(state)
    return None if deploy is None else hashlib.sha256(f"{deploy} {host_name}".encode()).hexdigest()


def _has_password(state: State, host: Host) -> bool:
    """Whether pyinfra could put a sudo or su password in this host's commands (kept out of the cache)."""
    return bool(
        host.data.get("_sudo_password")
        or host.data.get("_su_password")
        or state.config.SUDO_PASSWORD
        or state.config.SU_PASSWORD
        or host.connector_data.get("prompted_sudo_password")
    )


class EarlyReads(BaseStateCallback):
    """Send each host's stored state read when pyinfra first connects to it (module docstring)."""

    @staticmethod
    def host_connect(state: State, host: Host) -> None:
        connections = _CONNECTIONS.setdefault(state, {})
        client = getattr(host.connector, "client", None)
        key = deploy_key(state, host.name)
        if host.name in connections or client is None or key is None:
            return  # a reconnection, another connector than SSH, or not pyinfra's CLI
        if state not in _STORED:
            _STORED[state] = _stored()
        command = _STORED[state].get(key)
        sent = None
        if command is not None:
            try:
                streams = client.exec_command(command)
                streams[0].close()  # as pyinfra does with a command that has no stdin
                sent = (command, streams)
                logger.debug("Sent the last run's state read ahead on %s: %s", host.name, command)
            except (SSHException, OSError, EOFError) as error:  # it only costs the speedup
                logger.debug("Could not send the state read ahead on %s: %s", host.name, error)
        connection = _Connection(key, sent)
        connections[host.name] = connection
        client.exec_command = _taking_sent(state, host, connection, client.exec_command)


def _taking_sent(
    state: State, host: Host, connection: _Connection, exec_command: Callable[..., Streams]
) -> Callable[..., Streams]:
    def take_or_run(command: str, *args: Any, **kwargs: Any) -> Streams:
        sent, connection.sent = connection.sent, None
        first, connection.ran = not connection.ran, True
        if connection.recording and first and not _has_password(state, host):
            store_read(connection.key, command)
        if sent is not None:
            if sent[0] == command and not args and set(kwargs) <= {"get_pty"} and not kwargs.get("get_pty"):
                return sent[1]
            sent[1][1].channel.close()
            logger.debug("Dropped the read sent ahead on %s: the run's first command is another", host.name)
        return exec_command(command, *args, **kwargs)

    return take_or_run


def pyinfra_transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """The transport factory group_data/all.py gives pyinfra's SSH connections: `nodelay_transport`, and
    `EarlyReads` added to the run's state callbacks, once. Added here, as pyinfra connects: while it loads
    the group data its state is not initialised yet (`State.init` then starts with no callbacks)."""
    if ctx_state.isset():  # type: ignore[no-untyped-call]
        state = ctx_state.get()  # type: ignore[no-untyped-call]
        if not any(isinstance(handler, EarlyReads) for handler in state.callback_handlers):
            state.add_callback_handler(EarlyReads())
    return nodelay_transport(sock, **kwargs)


@contextlib.contextmanager
def recording(target: Host) -> Iterator[None]:
    """Store the next command run on `target` for the next run to send ahead, when it is the first of the run
    there (pvegpu's state read, before any operation's command)."""
    connection = _CONNECTIONS.get(target.state, {}).get(target.name)
    if connection is not None:
        connection.recording = True
    try:
        yield
    finally:
        if connection is not None:
            connection.recording = False
