"""`reboot_if_pending`: reboot only when the running kernel lacks the boot state pvegpu wrote, and only when
the inventory allows it; then wait until the host is back with that state (verified), or fail.

Not while what is not pvegpu's runs on the node (pvegpu/plan/reboot.py `foreign_refusal`: a guest is
pvegpu's only at the inventory's vmid and with pvegpu's mark), unless
`pve_host.allow_reboot_with_foreign_guests`; on the host-driver profiles, not onto a kernel without the
driver's module (plan/kernel_guard.py). `refuse_node_reboot` checks both while a role collects its
operations, before any host is changed (pyinfra's `-y` runs operation bodies only when it executes), and
the operation checks the guests again right before it reboots. Every reboot of a node goes through these
guards: pve_host's here, the NVIDIA driver role's (pvegpu/operations/nvidia.py) alike. The guest list
(`NodeGuestList`) is read only when a reboot is pending and allowed: a no-op run never reads it."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts.boot import KernelCmdline
from pvegpu.facts.hardware import PciHardware
from pvegpu.facts.next_boot import NextBoot
from pvegpu.facts.node_guests import NodeGuestList
from pvegpu.models.hardware import HostHardware
from pvegpu.operations.api_command import api_command, one_line_errors
from pvegpu.plan.kernel_guard import kernel_problems, module_built_anywhere
from pvegpu.plan.reboot import (
    FOREIGN_SWITCH,
    RebootGuard,
    foreign_refusal,
    foreign_running,
    foreign_summary,
    pending_message,
    pending_reasons,
)
from pvegpu.run.node_state import running_cmdline
from pvegpu.run.wait import WaitTimeoutError, wait_until

# The reboot is detached so the SSH channel closes at once (as pyinfra's server.reboot does).
REBOOT = "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"
_DELAY_S = 5.0
_INTERVAL_S = 2.0


@operation(is_idempotent=False, idempotent_notice="Reboots the host whenever a reboot is pending.")
@one_line_errors
def reboot_if_pending(
    *,
    hardware: HostHardware,
    tokens: tuple[str, ...],
    functions: tuple[str, ...],
    allow_reboot: bool,
    retired: tuple[str, ...] = (),
    vfio: bool = True,
    timeout_s: float,
    sysfs_root: str = "/sys",
    cmdline_path: str = "/proc/cmdline",
    guard: RebootGuard | None = None,
) -> Generator[StringCommand | FunctionCommand, None, None]:
    """Compare the running command line and GPU bindings with `tokens` / `functions` (all on vfio-pci, or
    with `vfio` False: none on vfio-pci); `retired` tokens (pvegpu removed them from the next boot) must be
    gone from the running command line.
    `hardware` is the host's `PciHardware` fact, read once by the role; the verify step reads it again.

    Nothing pending: noop. Pending and not allowed: noop with the exact pending message, nothing changed.
    Pending and allowed: reboot, then poll (reconnecting) until nothing is pending, for up to `timeout_s`;
    the operation fails with what is still pending after that. With `guard` (a Proxmox node): first
    `refuse_foreign_reboot`.
    """
    running = running_cmdline(host, cmdline_path)
    reasons = pending_reasons(running, tokens, hardware, functions, retired, vfio=vfio)
    if not reasons:
        bound = (
            f"{len(functions)} GPU functions are bound to vfio-pci"
            if vfio
            else f"none of {len(functions)} GPU functions is bound to vfio-pci"
        )
        host.noop(f"no reboot needed: the running kernel has {' '.join(tokens)} and {bound}")
        return
    if not allow_reboot:
        # Also a warning: pyinfra shows noop sentences only when asked (-v), and this one needs action.
        message = f"{pending_message(reasons)} (pve_host.allow_reboot is false: not rebooting)"
        logger.warning(f"{host.print_prefix}{message}")
        host.noop(message)
        return
    if guard is not None:
        refuse_foreign_reboot(host, guard)
    logger.info(f"{host.print_prefix}{pending_message(reasons)}: rebooting")
    yield StringCommand(REBOOT)

    def still_pending(target: Host) -> str | None:
        # Before the host went down this still reads the old state: keep polling until it matches.
        found = _reasons(
            target,
            tokens=tokens,
            retired=retired,
            vfio=vfio,
            functions=functions,
            sysfs_root=sysfs_root,
            cmdline_path=cmdline_path,
        )
        return pending_message(found) if found else None

    # An api_command: a host that does not come back as wanted fails in one line, with no traceback. It
    # runs with pyinfra's context host set to this host, which is what `host` resolves to then.
    yield api_command(wait_after_reboot, host, still_pending, timeout_s)


def refuse_node_reboot(target: Host, guard: RebootGuard) -> None:
    """Before `target` (Proxmox node `guard.node`) reboots: `refuse_foreign_reboot`, then with
    `guard.driver_version` (the node boots onto its own NVIDIA driver) `refuse_kernel_without_module`."""
    refuse_foreign_reboot(target, guard)
    if guard.driver_version is not None:
        refuse_kernel_without_module(target, guard.driver_version, proxmox=True)


def refuse_foreign_reboot(target: Host, guard: RebootGuard) -> None:
    """Before `target` (Proxmox node `guard.node`) reboots: OperationError with `foreign_refusal`'s line
    while a guest or HA resource that is not pvegpu's (`guard.ours`) would be stopped and
    `guard.allow_foreign` is false; with it, a warning naming them. Reads the node's guest list and the
    configs of the inventory's guests (one command)."""
    node, ours = guard.node, guard.ours
    listed = target.get_fact(NodeGuestList, node=node, own=ours.guests)
    refusal = foreign_refusal(listed, node, ours, guard.allow_foreign)
    if refusal is not None:
        raise OperationError(refusal)
    guests, services = foreign_running(listed, node, ours)
    if guests or services:
        logger.warning(
            f"{target.print_prefix}rebooting {node} stops what is not pvegpu's ({FOREIGN_SWITCH}): "
            f"{foreign_summary(guests, services, ours)}"
        )


def refuse_kernel_without_module(target: Host, driver_version: str, *, proxmox: bool) -> None:
    """Before `target` reboots onto its own NVIDIA driver (profiles lxc, baremetal): OperationError naming
    the kernel it boots next and the fix when that kernel lacks the module `driver_version`
    (plan/kernel_guard.py), once the driver is installed (a module built for some kernel: a first install
    builds its own). Reads the kernels and DKMS's tree (one command)."""
    boot = target.get_fact(NextBoot)
    if not module_built_anywhere(boot, driver_version):
        return
    problems = kernel_problems(boot, driver_version, proxmox=proxmox)
    if problems:
        raise OperationError(f"{target.name}: reboot refused: {'; '.join(problems)}")


def reboot_planned(
    target: Host,
    *,
    hardware: HostHardware,
    tokens: tuple[str, ...],
    functions: tuple[str, ...],
    retired: tuple[str, ...],
    vfio: bool,
    cmdline_path: str,
) -> bool:
    """Whether `reboot_if_pending` with these arguments will find a reboot pending: from the running state
    only (the command line and bindings), which the boot files this run writes do not change."""
    running = running_cmdline(target, cmdline_path)
    return bool(pending_reasons(running, tokens, hardware, functions, retired, vfio=vfio))


def wait_after_reboot(target: Host, pending: Callable[[Host], str | None], timeout_s: float) -> None:
    """`target` was told to reboot: give it time to go down, then reconnect and ask `pending` (None: the host
    is back as wanted, else what is still wrong) until it answers None. After `timeout_s`, OperationError
    `after reboot, N s: <the last answer>` (`the host did not come back` while it does not answer SSH)."""
    time.sleep(_DELAY_S)
    target.disconnect()

    def back() -> str | None:
        target.connect(show_errors=False)
        if not target.connected:
            return "the host did not come back"
        missing = pending(target)
        if missing is not None:
            target.disconnect()
        return missing

    try:
        wait_until(back, timeout_s, "the host is not back as wanted", interval_s=_INTERVAL_S)
    except WaitTimeoutError as timeout:
        raise OperationError(f"after reboot, {timeout_s:.0f} s: {timeout.last}") from None


def _reasons(
    target: Host,
    *,
    tokens: tuple[str, ...],
    retired: tuple[str, ...],
    vfio: bool,
    functions: tuple[str, ...],
    sysfs_root: str,
    cmdline_path: str,
) -> tuple[str, ...]:
    running = target.get_fact(KernelCmdline, cmdline_path=cmdline_path)
    hardware = target.get_fact(PciHardware, sysfs_root=sysfs_root)
    return pending_reasons(running, tokens, hardware, functions, retired, vfio=vfio)
