"""The `lxc` profile's container through the Proxmox API: `lxc_container` (create or converge keys and
`devN` entries), `lxc_raw_lines` (the raw `lxc.*` lines the API cannot write) and `container_driver` (the
container's userspace driver equals the host's kernel module). Starting and parking it are
pvegpu/operations/pve_guest.py's, with `CT`.

Reads happen while preparing, writes are function commands (API) or shell commands (the config file), so
`--dry` reads but never writes.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.create_records import CreateLedger
from pvegpu.operations.pve_guest import CT, Guest, converge
from pvegpu.plan.lxc import diff_container, raw_of, version_drift
from pvegpu.pve import PveClient

LXC_CONF = "/etc/pve/lxc/{vmid}.conf"


@operation()
def lxc_container(
    *,
    api: PveClient,
    node: str,
    vmid: int,
    config: Mapping[str, str],
    create: Mapping[str, str],
    timeout_s: float,
    ledger: CreateLedger | None = None,
) -> Generator[FunctionCommand, None, None]:
    """Create container `vmid` with `config` + `create` when absent, else PUT the keys that differ and
    delete the `devN` entries not in `config` (with the read's digest). `ledger`: pvegpu's records of its
    creates (`converge`)."""
    devices = sum(1 for key in config if key.startswith("dev"))
    yield from converge(
        Guest(CT, api, node, vmid),
        create={**config, **create},
        diff=lambda current: diff_container(config, current),
        unchanged=f"CT {vmid} on {node} has its config: {devices} device entries",
        timeout_s=timeout_s,
        ledger=ledger,
    )


@operation()
def lxc_raw_lines(
    *, api: PveClient, node: str, vmid: int, wanted: Sequence[tuple[str, str]], replace: str
) -> Generator[StringCommand, None, None]:
    """Append each `wanted` raw line the container's config lacks (the API's `lxc` list) to its config file;
    first delete the lines that start with `replace` and are not wanted (pvegpu's /dev/shm line of another
    size). A container not created yet has none. Noop when all are there."""
    config = Guest(CT, api, node, vmid).config_or_none()
    current = () if config is None else raw_of(config.values)
    path = LXC_CONF.format(vmid=int(vmid))
    stale = [f"{k}: {v}" for k, v in current if f"{k}: {v}".startswith(replace) and (k, v) not in wanted]
    missing = [f"{k}: {v}" for k, v in wanted if (k, v) not in current]
    if not stale and not missing:
        host.noop(f"{path} has its {len(wanted)} raw lxc lines")
        return
    if stale:
        yield StringCommand("sed", "-i", QuoteString(f"\\|^{replace}|d"), QuoteString(path))
    for line in missing:
        yield StringCommand("printf", "'%s\\n'", QuoteString(line), ">>", QuoteString(path))


@operation()
def container_driver(
    *, vmid: int, host_module: str | None, container_userspace: str | None
) -> Generator[StringCommand, None, None]:
    """The drift check, every run: noop when container `vmid`'s userspace driver equals the host's kernel
    module; fail with both versions when they differ (`pvegpu.plan.lxc.version_drift`); a side without a
    driver yet (the first deploy) is a warning: nothing to compare."""
    problem = version_drift(host_module, container_userspace)
    if problem is None:
        host.noop(f"CT {vmid}: userspace driver {container_userspace} equals the host kernel module")
    elif host_module is not None and container_userspace is not None:
        raise OperationError(f"CT {vmid}: {problem}")
    else:
        logger.warning(f"{host.print_prefix}CT {vmid}: {problem}")
        host.noop(f"CT {vmid}: driver versions not compared: {problem}")
    yield from ()
