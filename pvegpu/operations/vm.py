"""The Q35 VM through the Proxmox API: `q35_vm` (create or converge the config), `vm_running` (start, wait
for the task and for the VM to run), and `guest_gpus` (the guest sees the GPUs it should).

Reads happen while preparing (the config with its digest, the status); writes are function commands run
while executing, so `--dry` shows the change (logged) without making it. The config PUT carries the
digest of the read it was diffed against: a concurrent edit fails with Proxmox's `checksum mismatch` and
nothing is written. A VM is created only when it does not exist; an existing one (with its disks) is
never recreated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import GuestConfig
from pvegpu.plan.hostpci import HostPciError
from pvegpu.plan.vm import VmChange, diff_vm, nvidia_gpus
from pvegpu.pve import PveClient, PveError, TaskFailedError

_POLL_S = 1.0


def vm_config_or_none(api: PveClient, node: str, vmid: int) -> GuestConfig | None:
    """The VM's config, None when Proxmox says its config file does not exist."""
    try:
        return api.vm_config(node, vmid)
    except PveError as error:
        if error.message.startswith("Configuration file ") and error.message.endswith("does not exist"):
            return None
        raise


@operation()
def q35_vm(
    *,
    api: PveClient,
    node: str,
    vmid: int,
    config: Mapping[str, str],
    create: Mapping[str, str],
    prefix: str,
    timeout_s: float,
) -> Generator[FunctionCommand, None, None]:
    """Create VM `vmid` on `node` with `config` + `create` (plan/vm.py) when absent, else PUT the keys that
    differ (with the read's digest). Raises OperationError for a hostpci slot pvegpu must not take."""
    current = vm_config_or_none(api, node, vmid)
    if current is None:
        params = {**config, **create}
        logger.info(
            f"{host.print_prefix}VM {vmid}: create " + " ".join(f"{k}={params[k]}" for k in sorted(params))
        )
        yield FunctionCommand(_create, (api, node, vmid, params, timeout_s), {})
        return
    try:
        change = diff_vm(config, create, current.values, prefix)
    except HostPciError as error:
        raise OperationError(f"VM {vmid}: {error}") from None
    if not change.changed:
        count = sum(1 for key in config if key.startswith("hostpci"))
        host.noop(
            f"VM {vmid} ({config['name']}) on {node} has its config: {config['machine']}, ovmf, "
            f"{count} hostpci devices"
        )
        return
    shown = [f"{k}: {current.values.get(k)} -> {v}" for k, v in sorted(change.set.items())]
    shown += [f"{k}: delete" for k in change.delete]
    for line in shown:
        logger.info(f"{host.print_prefix}VM {vmid} {line}")
    yield FunctionCommand(_update, (api, node, vmid, change, current.digest), {})


def _create(api: PveClient, node: str, vmid: int, params: Mapping[str, str], timeout_s: float) -> None:
    try:
        api.wait_task(api.create_vm(node, vmid, params), timeout_s)
    except PveError as error:
        raise OperationError(f"VM {vmid} not created: {error.message}") from None


def _update(api: PveClient, node: str, vmid: int, change: VmChange, digest: str) -> None:
    try:
        api.update_vm_config(node, vmid, change.set, digest, change.delete)
    except PveError as error:
        raise OperationError(f"VM {vmid} config not updated, nothing overwritten: {error.message}") from None


@operation(is_idempotent=True)
def vm_running(
    *,
    api: PveClient,
    node: str,
    vmid: int,
    unbound: Sequence[str],
    timeout_s: float,
    recheck: Callable[[Host], Sequence[str]] | None = None,
) -> Generator[FunctionCommand, None, None]:
    """Start VM `vmid` unless it runs; wait for the start task (its failure carries Proxmox's message, e.g.
    `PCI device mapping invalid (hardware probably changed): ...`) and until the VM reports running.

    `unbound` lists the mapped GPUs' functions not bound to vfio-pci on the node: starting is refused
    while any is (deploy/host.py binds them). With `recheck` (host -> unbound functions, read again when
    the start executes), the refusal waits until then: an earlier operation of the same run (the host
    role's reboot, deploy/site.py) may bind them.
    """
    config = vm_config_or_none(api, node, vmid)
    if config is not None and api.vm_status(node, vmid).status == "running":
        host.noop(f"VM {vmid} is running on {node}")
        return
    if unbound and recheck is None:
        raise OperationError(_refusal(vmid, node, unbound))
    logger.info(f"{host.print_prefix}VM {vmid}: start on {node}")
    if unbound and recheck is not None:
        check = recheck

        # pyinfra passes (state, host) to a FunctionCommand only when the parameters have exactly these names.
        def start_when_bound(state: State, host: Host) -> None:
            del state
            still = check(host)
            if still:
                raise OperationError(_refusal(vmid, node, still))
            _start(api, node, vmid, timeout_s)

        yield FunctionCommand(start_when_bound, (), {})
        return
    yield FunctionCommand(_start, (api, node, vmid, timeout_s), {})


def _refusal(vmid: int, node: str, unbound: Sequence[str]) -> str:
    return (
        f"refusing to start VM {vmid}: vfio binding not in effect on {node} for "
        f"{', '.join(unbound)} (run deploy/host.py)"
    )


def _start(api: PveClient, node: str, vmid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        api.wait_task(api.start_vm(node, vmid), timeout_s)
    except TaskFailedError as error:
        raise OperationError(f"VM {vmid} did not start: {error.message}") from None
    except PveError as error:
        raise OperationError(f"VM {vmid} not started: {error.message}") from None
    while api.vm_status(node, vmid).status != "running":
        if time.monotonic() > deadline:
            raise OperationError(
                f"VM {vmid}: the start task ended OK, but it is not running after {timeout_s:g} s"
            )
        time.sleep(_POLL_S)


@operation()
def guest_gpus(hardware: HostHardware, expected: int) -> Generator[FunctionCommand, None, None]:
    """Check (read-only) that the guest's PCI bus shows `expected` NVIDIA GPUs; else fail naming them."""
    found = nvidia_gpus(hardware)
    if len(found) != expected:
        raise OperationError(
            f"the guest sees {len(found)} NVIDIA GPUs, expected {expected}: {', '.join(found) or 'none'}"
        )
    host.noop(f"the guest sees {expected} NVIDIA GPUs: {', '.join(found)}")
    yield from ()
