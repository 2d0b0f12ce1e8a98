"""Parking a guest that holds the GPUs (the managed VM or container of a profile not in use): `onboot: 0`,
then stopped, so the next profile gets the GPUs. Shared by `vm_parked` and `lxc_parked`; not an operation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.models.pve import GuestConfig
from pvegpu.pve import PveClient, PveError

_POLL_S = 1.0


@dataclass(frozen=True)
class Guest:
    """One guest as the parking steps see it: `label` ("VM 100", "CT 200") and its API calls."""

    label: str
    node: str
    status: Callable[[], str]
    clear_onboot: Callable[[str], object]
    stop: Callable[[], str]

    @classmethod
    def vm(cls, api: PveClient, node: str, vmid: int) -> Guest:
        return cls(
            f"VM {vmid}",
            node,
            lambda: api.vm_status(node, vmid).status,
            lambda digest: api.update_vm_config(node, vmid, {"onboot": 0}, digest),
            lambda: api.stop_vm(node, vmid),
        )

    @classmethod
    def container(cls, api: PveClient, node: str, vmid: int) -> Guest:
        return cls(
            f"CT {vmid}",
            node,
            lambda: api.lxc_status(node, vmid),
            lambda digest: api.update_lxc_config(node, vmid, {"onboot": 0}, digest),
            lambda: api.stop_lxc(node, vmid),
        )


def park(
    api: PveClient,
    guest: Guest,
    config: GuestConfig,
    *,
    profile: str,
    allow_stop: bool,
    timeout_s: float,
) -> Generator[FunctionCommand, None, None]:
    """Yield what parks `guest` (existing, with `config`): `onboot: 0` (PUT with the read's digest), then a
    stop and a wait until it is stopped. Noop when stopped with `onboot: 0`. Running and `allow_stop` false:
    nothing changed; a warning and the noop say what would be done."""
    running = guest.status() == "running"
    onboot = str(config.values.get("onboot", "0")) == "1"
    if running and not allow_stop:
        message = (
            f"profile {profile}: {guest.label} is running on {guest.node} with the GPUs; would stop it and "
            "set onboot 0 (pve_host.allow_reboot is false: not stopping it)"
        )
        logger.warning(f"{host.print_prefix}{message}")
        host.noop(message)
        return
    if not running and not onboot:
        host.noop(f"{guest.label} on {guest.node} is stopped and not started at boot (onboot 0)")
        return
    if onboot:
        logger.info(f"{host.print_prefix}{guest.label}: onboot 1 -> 0 (profile {profile})")
        yield FunctionCommand(_no_onboot, (guest, config.digest), {})
    if running:
        logger.info(f"{host.print_prefix}{guest.label}: stop on {guest.node} (profile {profile})")
        yield FunctionCommand(_stop, (api, guest, timeout_s), {})


def _no_onboot(guest: Guest, digest: str) -> None:
    try:
        guest.clear_onboot(digest)
    except PveError as error:
        raise OperationError(
            f"{guest.label} onboot not cleared, nothing overwritten: {error.message}"
        ) from None


def _stop(api: PveClient, guest: Guest, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        api.wait_task(guest.stop(), timeout_s)
    except PveError as error:
        raise OperationError(f"{guest.label} not stopped: {error.message}") from None
    while guest.status() != "stopped":
        if time.monotonic() > deadline:
            message = f"{guest.label}: the stop task ended OK, but it runs after {timeout_s:g} s"
            raise OperationError(message)
        time.sleep(_POLL_S)
