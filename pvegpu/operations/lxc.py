"""The `lxc` profile's container through the Proxmox API: `lxc_container` (create or converge keys and
`devN` entries), `lxc_raw_lines` (the raw `lxc.*` lines the API cannot write), `lxc_running` (started),
`container_driver` (the container's userspace driver equals the host's kernel module); and for the other
profiles `lxc_parked` (stopped, `onboot: 0`: it lets go of the GPUs; never deleted, its disk is kept).

Reads happen while preparing, writes are function commands (API) or shell commands (the config file), so
`--dry` reads but never writes. The PUT carries the digest of the read it was diffed against: a concurrent
edit fails with Proxmox's `detected modified configuration` and nothing is written. A container is
created only when it does not exist; an existing one is never recreated.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.models.pve import GuestConfig
from pvegpu.operations.park import Guest, park
from pvegpu.plan.lxc import ContainerChange, diff_container, raw_of, version_drift
from pvegpu.pve import PveClient, PveError

_POLL_S = 1.0
LXC_CONF = "/etc/pve/lxc/{vmid}.conf"


def lxc_config_or_none(api: PveClient, node: str, vmid: int) -> GuestConfig | None:
    """The container's config, None when Proxmox says its config file does not exist."""
    try:
        return api.lxc_config(node, vmid)
    except PveError as error:
        if error.message.startswith("Configuration file ") and error.message.endswith("does not exist"):
            return None
        raise


@operation()
def lxc_container(
    *,
    api: PveClient,
    node: str,
    vmid: int,
    config: Mapping[str, str],
    create: Mapping[str, str],
    timeout_s: float,
) -> Generator[FunctionCommand, None, None]:
    """Create container `vmid` with `config` + `create` when absent, else PUT the keys that differ and
    delete the `devN` entries not in `config` (with the read's digest)."""
    current = lxc_config_or_none(api, node, vmid)
    if current is None:
        params = {**config, **create}
        logger.info(
            f"{host.print_prefix}CT {vmid}: create " + " ".join(f"{k}={params[k]}" for k in sorted(params))
        )
        yield FunctionCommand(_create, (api, node, vmid, params, timeout_s), {})
        return
    change = diff_container(config, current.values)
    if not change.changed:
        devices = sum(1 for key in config if key.startswith("dev"))
        host.noop(f"CT {vmid} on {node} has its config: {devices} device entries")
        return
    for key, value in sorted(change.set.items()):
        logger.info(f"{host.print_prefix}CT {vmid} {key}: {current.values.get(key)} -> {value}")
    for key in change.delete:
        logger.info(f"{host.print_prefix}CT {vmid} {key}: delete")
    yield FunctionCommand(_update, (api, node, vmid, change, current.digest), {})


def _create(api: PveClient, node: str, vmid: int, params: Mapping[str, str], timeout_s: float) -> None:
    try:
        api.wait_task(api.create_lxc(node, vmid, params), timeout_s)
    except PveError as error:
        raise OperationError(f"CT {vmid} not created: {error.message}") from None


def _update(api: PveClient, node: str, vmid: int, change: ContainerChange, digest: str) -> None:
    try:
        api.update_lxc_config(node, vmid, change.set, digest, change.delete)
    except PveError as error:
        raise OperationError(f"CT {vmid} config not updated, nothing overwritten: {error.message}") from None


@operation()
def lxc_raw_lines(
    *, api: PveClient, node: str, vmid: int, wanted: Sequence[tuple[str, str]], replace: str
) -> Generator[StringCommand, None, None]:
    """Append each `wanted` raw line the container's config lacks (the API's `lxc` list) to its config file;
    first delete the lines that start with `replace` and are not wanted (pvegpu's /dev/shm line of another
    size). A container not created yet has none. Noop when all are there."""
    config = lxc_config_or_none(api, node, vmid)
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


@operation(is_idempotent=True)
def lxc_running(
    *, api: PveClient, node: str, vmid: int, timeout_s: float
) -> Generator[FunctionCommand, None, None]:
    """Start container `vmid` unless it runs; wait for the task and until it reports running."""
    if lxc_config_or_none(api, node, vmid) is not None and api.lxc_status(node, vmid) == "running":
        host.noop(f"CT {vmid} is running on {node}")
        return
    logger.info(f"{host.print_prefix}CT {vmid}: start on {node}")
    yield FunctionCommand(_start, (api, node, vmid, timeout_s), {})


def _start(api: PveClient, node: str, vmid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        api.wait_task(api.start_lxc(node, vmid), timeout_s)
    except PveError as error:
        raise OperationError(f"CT {vmid} did not start: {error.message}") from None
    while api.lxc_status(node, vmid) != "running":
        if time.monotonic() > deadline:
            raise OperationError(
                f"CT {vmid}: the start task ended OK, but it is not running after {timeout_s:g} s"
            )
        time.sleep(_POLL_S)


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


@operation()
def lxc_parked(
    *, api: PveClient, node: str, vmid: int, profile: str, allow_stop: bool, timeout_s: float
) -> Generator[FunctionCommand, None, None]:
    """`vm` / `baremetal`: set `onboot: 0` (PUT with the read's digest) and stop container `vmid` when it
    runs. Noop when it does not exist or is stopped with `onboot: 0`. Running and `allow_stop` false:
    nothing changed; a warning and the noop say what would be done."""
    config = lxc_config_or_none(api, node, vmid)
    if config is None:
        host.noop(f"CT {vmid} does not exist on {node}: no container holds the GPUs")
        return
    yield from park(
        api,
        Guest.container(api, node, vmid),
        config,
        profile=profile,
        allow_stop=allow_stop,
        timeout_s=timeout_s,
    )
