"""The Q35 VM through the Proxmox API: `q35_vm` (create or converge the config), `vm_pending` (what a
running VM holds in `[PENDING]` is applied by a cold restart, or reported with the command that applies
it) and `guest_gpus` (the guest sees the GPUs it should). Starting and parking it are
pvegpu/operations/pve_guest.py's, with `VM`.

The pending rule. Proxmox applies a change of `args`, `hostpciN`, `cpu`, `machine`, ... to a running VM
only when QEMU starts again (qemu-server API2/Qemu.pm `$update_vm_api`); neither the run that wrote it nor
a reboot inside the guest does. So after the VM is converged and started, every key its config holds in
`[PENDING]` (`GET …/config` against `GET …/config?current=1`) is either applied, by a cold restart through
the API (shutdown, stop when the guest does not shut down, start, running again, nothing pending left),
when `pve_host.allow_reboot` allows pvegpu to stop what runs on the node, or reported: a warning naming
every pending key and the command that applies them (`qm shutdown <vmid> && qm start <vmid>`), and the run
goes on. A restart also waits while this run converges the VM's guest (its connection would be cut):
deploy/vm.py applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import ctx_state, host

from pvegpu.local.create_records import CreateLedger
from pvegpu.models.hardware import HostHardware
from pvegpu.operations.api_command import api_command, one_line_errors
from pvegpu.operations.pve_guest import Guest, Ownership, converge, wait_status
from pvegpu.operations.start_failure import start_failure
from pvegpu.plan.hostpci import HostPciError
from pvegpu.plan.vm import VmChange, VmPlan, diff_vm, nvidia_gpus, pending_keys, pending_report
from pvegpu.pve.errors import PveError, TaskFailedError
from pvegpu.run.plan import guest_host_of


@operation()
def q35_vm(
    *,
    guest: Guest,
    vm: VmPlan,
    timeout_s: float,
    ledger: CreateLedger | None = None,
    ownership: Ownership | None = None,
) -> Generator[FunctionCommand, None, None]:
    """Create VM `guest` with the plan's `config` + `create` (plan/vm.py `VmPlan`: `created_with`) when
    absent, else PUT the keys that differ (with the read's digest). Raises OperationError for a hostpci slot
    pvegpu must not take. With `vm.p2p: probe` pvegpu's GPUDirect clique parts of `args` are left as they are
    (the P2P operation owns them). `ledger`: pvegpu's records of its creates (`converge`). `ownership`:
    pvegpu's mark (created with it; an existing VM without it refused unless `vm.adopt`:
    pvegpu/operations/pve_guest.py)."""
    config, prefix, keep_clique = vm.config, vm.spec.mapping_prefix, vm.spec.p2p == "probe"

    def diff(current: Mapping[str, object]) -> VmChange:
        try:
            change = diff_vm(config, vm.create, current, prefix, keep_clique=keep_clique)
        except HostPciError as error:
            raise OperationError(f"VM {guest.vmid}: {error}") from None
        for note in change.notes:
            logger.warning(f"{host.print_prefix}VM {guest.vmid}: {note}")
        return change

    count = sum(1 for key in config if key.startswith("hostpci"))
    yield from converge(
        guest,
        create=vm.created_with,
        diff=diff,
        unchanged=(
            f"VM {guest.vmid} ({config['name']}) on {guest.node} has its config: {config['machine']}, ovmf, "
            f"{count} hostpci devices"
        ),
        timeout_s=timeout_s,
        ledger=ledger,
        ownership=ownership,
    )


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


class StartFailedError(OperationError):
    """The VM's start task failed; `line` is what it said (QEMU's own error line where the log has one)."""

    def __init__(self, label: str, line: str) -> None:
        self.line = line
        super().__init__(f"{label} did not start: {line}")


def cold_restart(guest: Guest, timeout_s: float) -> None:
    """Shut the VM down (stop it when the guest does not), start it, wait until it runs: a new QEMU, so
    its pending changes apply. A failed start raises StartFailedError (`start_failure`'s line); any other
    failed call an OperationError naming it."""
    api, node, vmid = guest.api, guest.node, guest.vmid
    try:
        try:
            api.wait_task(api.shutdown_vm(node, vmid, int(timeout_s)), timeout_s + 30)
        except PveError:
            api.wait_task(api.stop_vm(node, vmid), timeout_s)
        start = api.start_vm(node, vmid)
        try:
            api.wait_task(start, timeout_s)
        except TaskFailedError as error:
            raise StartFailedError(guest.label, start_failure(api, error)) from None
    except PveError as error:
        raise OperationError(f"{guest.label}: restart failed: {error.line}") from None
    wait_status(guest, "running", timeout_s, "running after its restart")


def guest_in_run(node_host: Host) -> bool:
    """Whether this run also converges `node_host`'s VM guest (it has operations here): a VM restart now
    would cut the guest's connection half-way, so it waits for a run without it (deploy/vm.py)."""
    guest, state = guest_host_of(node_host), node_host.state
    return guest is not None and state.is_host_in_limit(guest) and bool(state.ops.get(guest))


def _pending(guest: Guest) -> tuple[str, ...]:
    """The VM's pending keys (`pending_keys`) read now; () for a VM that does not run (a start applies
    everything) or does not exist."""
    api, node, vmid = guest.api, guest.node, guest.vmid
    if guest.config_or_none() is None or guest.status() != "running":
        return ()
    return pending_keys(api.vm_config(node, vmid).values, api.vm_config(node, vmid, current=True).values)


@operation(is_idempotent=False)
@one_line_errors
def vm_pending(
    *,
    guest: Guest,
    allow_restart: bool,
    config_changing: Callable[[], bool],
    timeout_s: float,
) -> Generator[FunctionCommand, None, None]:
    """Apply what running VM `guest` holds in `[PENDING]` by a cold restart when `allow_restart`
    (`pve_host.allow_reboot`), else warn naming every pending key and the command (module docstring).
    `config_changing`: whether an earlier operation of this run writes the VM's config; asked only when
    this runs before anything executed (pyinfra's change detection), and then the decision is made again
    when it executes (the write may leave keys pending). Not idempotent: it restarts the VM, but only while
    something is pending, so a run after it does nothing."""
    try:
        keys = _pending(guest)
    except PveError as error:
        raise OperationError(f"{guest.label}: pending changes not read: {error.line}") from None
    executing = _executing()
    settled = executing or not config_changing()  # what is read now is what the restart would apply
    if settled and not keys:
        host.noop(f"{guest.label} has no pending changes")
        return
    if settled and (not allow_restart or (executing and guest_in_run(host))):
        _report(guest, keys, allow_restart)
        host.noop(f"{guest.label}: {', '.join(keys)} pending, not applied")
        return
    yield api_command(_apply, guest, allow_restart, timeout_s)


def _executing() -> bool:
    """Whether pyinfra runs this operation's body while executing (`-y`: no change detection first), so
    every earlier operation has done its writes."""
    state: State | None = ctx_state.get()  # type: ignore[no-untyped-call]
    return state is not None and state.is_executing


def _report(guest: Guest, keys: tuple[str, ...], allow_restart: bool) -> None:
    why = "pve_host.allow_reboot is false: pvegpu does not restart it"
    if allow_restart:
        why = "this run also converges its guest, whose connection a restart would cut: run deploy/vm.py"
    logger.warning(f"{host.print_prefix}{pending_report(guest.vmid, guest.node, keys, why)}")


def _apply(guest: Guest, allow_restart: bool, timeout_s: float) -> None:
    """While executing: read the pending keys again; report or restart (module docstring)."""
    try:
        keys = _pending(guest)
    except PveError as error:
        raise OperationError(f"{guest.label}: pending changes not read: {error.line}") from None
    if not keys:
        logger.info(f"{host.print_prefix}{guest.label} has no pending changes")
        return
    if not allow_restart or guest_in_run(host):
        _report(guest, keys, allow_restart)
        return
    logger.info(f"{host.print_prefix}{guest.label}: {', '.join(keys)} pending: cold restart to apply them")
    cold_restart(guest, timeout_s)
    try:
        left = _pending(guest)
    except PveError as error:
        raise OperationError(
            f"{guest.label}: pending changes not read after the restart: {error.line}"
        ) from None
    if left:
        raise OperationError(f"{guest.label}: {', '.join(left)} still pending after a cold restart")
    logger.info(f"{host.print_prefix}{guest.label} restarted: its pending changes apply")
