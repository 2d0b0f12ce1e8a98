"""The Proxmox API of the node being deployed, as operations observe it: a `PveClient` per host.

Why not pyinfra facts: a fact is a shell command run over the host's connection, but the `https` backend
never runs a command on the host, and the API's answers (a digest, task ids) are only meaningful to the
same client that then writes. So operations read the API through `pve_client(host)` while they are
prepared (when pyinfra reads facts), diff, and yield `FunctionCommand`s that write through the same client
when pyinfra executes; `--dry` prepares without executing, so it reads but never writes.

`pve_client` builds the client from the host's `pve` data (`PveApiSpec`), falling back to the host's own
SSH settings for the `ssh` backend, and caches one per host for the run. The token secret is read from
its file, which must be mode 0600 (else refused); it is never logged or put in an error message.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from pvegpu.models.inventory import spec_of
from pvegpu.models.pve_api import PVE_KEY, PveApiSpec
from pvegpu.pve import PveClient, connect_https, connect_local, connect_ssh

_CLIENTS: dict[str, PveClient] = {}


class PveSetupError(ValueError):
    """The `pve` data cannot give a client (no address, an unsafe token file); the message says why."""


def api_spec(data: Any) -> PveApiSpec:
    """The host's validated `pve` spec (defaults when absent); `data` is `host.data`."""
    return spec_of(data, PVE_KEY, PveApiSpec)


def read_token(path: str) -> str:
    """The secret in `path`; refused unless the file is a regular file only its owner can read (0600)."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except OSError as error:
        raise PveSetupError(f"pve.token_file {path}: {error.strerror}") from None
    if not stat.S_ISREG(mode) or stat.S_IMODE(mode) & 0o077:
        raise PveSetupError(f"pve.token_file {path}: must be a regular file with mode 0600")
    secret = file.read_text().strip()
    if not secret:
        raise PveSetupError(f"pve.token_file {path}: is empty")
    return secret


def connect(spec: PveApiSpec, data: Any) -> PveClient:
    """A new client for `spec`; `data` (host data) supplies the SSH defaults."""
    if spec.backend == "local":
        return connect_local(sudo=spec.sudo)
    hostname = spec.hostname or data.get("ssh_hostname")
    if not hostname:
        raise PveSetupError("pve.hostname: not set, and the host has no ssh_hostname")
    if spec.backend == "https":
        assert spec.token_id is not None  # the model requires both for https
        assert spec.token_file is not None
        return connect_https(
            hostname,
            spec.token_id,
            read_token(spec.token_file),
            port=spec.port or 8006,
            ca_file=spec.ca_file,
            fingerprint=spec.fingerprint,
        )
    return connect_ssh(
        hostname,
        spec.ssh_user or data.get("ssh_user") or "root",
        port=spec.port or int(data.get("ssh_port") or 22),
        key_filename=spec.ssh_key or data.get("ssh_key"),
        known_hosts=spec.known_hosts or data.get("ssh_known_hosts_file"),
        sudo=spec.sudo,
    )


def pve_client(host: Any) -> PveClient:
    """The cached client of pyinfra `host` (one connection per host and run)."""
    client = _CLIENTS.get(host.name)
    if client is None:
        client = _CLIENTS[host.name] = connect(api_spec(host.data), host.data)
    return client
