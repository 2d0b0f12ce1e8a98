"""Is a reboot pending? Compare the running kernel with the boot state pvegpu wrote. Pure.

Pending: a desired token missing from the running command line, and with vfio wanted (`vm`): no IOMMU
groups, or a selected GPU function not bound to vfio-pci; without (`lxc`, `baremetal`): a selected GPU
function still bound to vfio-pci. Each reason is one clause of the message operators read:
`reboot required: /proc/cmdline lacks iommu=pt; 0000:41:00.0 still bound to nvidia`.

Before such a reboot, `foreign_refusal`: what it would stop that is not pvegpu's (running guests other than
the inventory's `vm.vmid` / `lxc.vmid`, HA services placed on the node that HA keeps started) refuses it,
unless `pve_host.allow_reboot_with_foreign_guests`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from pvegpu.models.hardware import HostHardware
from pvegpu.models.node_guests import HaService, NodeGuest, NodeGuests

VFIO_DRIVER = "vfio-pci"
FOREIGN_SWITCH = "pve_host.allow_reboot_with_foreign_guests"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,63}")
_GUEST_SID = re.compile(r"(?:vm|ct):([0-9]+)")


def pending_reasons(
    running: Sequence[str],
    desired: Sequence[str],
    hw: HostHardware,
    functions: Sequence[str],
    retired: Sequence[str] = (),
    *,
    vfio: bool = True,
) -> tuple[str, ...]:
    """Every difference between the running state and the wanted one, in a stable order; () when none.

    `retired`: tokens pvegpu owned and no longer wants (removed from the next boot's command line).
    `vfio`: the `functions` must be bound to vfio-pci (True) or to anything else (False).
    """
    if not vfio:
        return _host_driver_reasons(running, desired, hw, functions, retired)
    reasons = _token_reasons(running, desired, retired)
    if not hw.iommu_present:
        reasons.append("the IOMMU is off (no IOMMU groups)")
    # Functions in the same state share one clause: "0000:41:00.0, 0000:51:00.0 still bound to nvidia".
    clauses: dict[str, list[str]] = {}
    for address in functions:
        function = hw.by_address.get(address)
        if function is None:
            clauses.setdefault("missing", []).append(address)
        elif function.driver is None:
            clauses.setdefault("bound to no driver", []).append(address)
        elif function.driver != VFIO_DRIVER:
            clauses.setdefault(f"still bound to {function.driver}", []).append(address)
    reasons.extend(f"{', '.join(addresses)} {state}" for state, addresses in clauses.items())
    return tuple(reasons)


def _host_driver_reasons(
    running: Sequence[str],
    desired: Sequence[str],
    hw: HostHardware,
    functions: Sequence[str],
    retired: Sequence[str],
) -> tuple[str, ...]:
    reasons = list(_token_reasons(running, desired, retired))
    held = [
        address
        for address in functions
        if (function := hw.by_address.get(address)) is not None and function.driver == VFIO_DRIVER
    ]
    if held:
        reasons.append(f"{', '.join(held)} still bound to {VFIO_DRIVER}")
    return tuple(reasons)


def _token_reasons(running: Sequence[str], desired: Sequence[str], retired: Sequence[str]) -> list[str]:
    reasons = []
    missing = [token for token in desired if token not in running]
    if missing:
        reasons.append(f"/proc/cmdline lacks {' '.join(missing)}")
    stale = [token for token in retired if token in running and token not in desired]
    if stale:
        reasons.append(f"/proc/cmdline still has {' '.join(stale)}")
    return reasons


def pending_message(reasons: Sequence[str]) -> str:
    return "reboot required: " + "; ".join(reasons)


def foreign_running(
    listed: NodeGuests, node: str, own: Collection[int]
) -> tuple[tuple[NodeGuest, ...], tuple[HaService, ...]]:
    """What a reboot of `node` stops that is not pvegpu's: guests `running` whose vmid is not in `own`, and
    HA services placed on `node` whose requested state is `started` (HA keeps them running: the reboot
    stops or moves them) and whose vmid is not in `own`."""
    guests = tuple(g for g in listed.guests if g.status == "running" and g.vmid not in own)
    services = tuple(
        service
        for service in listed.ha
        if service.node == node
        and service.request_state == "started"
        and not ((match := _GUEST_SID.fullmatch(service.sid)) and int(match[1]) in own)
    )
    return guests, services


def foreign_summary(guests: Sequence[NodeGuest], services: Sequence[HaService]) -> str:
    """`running VM 300 (web), CT 301 (db); HA resources on the node: vm:300 (started)`."""
    clauses = []
    if guests:
        clauses.append("running " + ", ".join(f"{g.kind} {g.vmid} ({_name(g.name)})" for g in guests))
    if services:
        shown = ", ".join(f"{_name(s.sid)} ({_name(s.state or 'unknown')})" for s in services)
        clauses.append(f"HA resources on the node: {shown}")
    return "; ".join(clauses)


def foreign_refusal(listed: NodeGuests, node: str, own: Collection[int], allowed: bool) -> str | None:
    """None when the reboot of `node` may go ahead: nothing foreign runs (`foreign_running`), or `allowed`
    (the switch); else the one-line refusal naming each guest and HA resource, and the switch. A list that
    could not be read refuses too (nothing proves the node holds only pvegpu's guests)."""
    if allowed:
        return None
    if listed.problem is not None:
        return f"not rebooting {node}: {listed.problem}; or set {FOREIGN_SWITCH}: true"
    guests, services = foreign_running(listed, node, own)
    if not guests and not services:
        return None
    return (
        f"not rebooting {node}: it would stop what is not pvegpu's: {foreign_summary(guests, services)}; "
        f"stop or migrate them, or set {FOREIGN_SWITCH}: true"
    )


def _name(text: str) -> str:
    return text if _PLAIN_NAME.fullmatch(text) else repr(text)[:40]
