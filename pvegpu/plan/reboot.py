"""Is a reboot pending? Compare the running kernel with the boot state pvegpu wrote. Pure.

Pending: a desired token missing from the running command line, and with vfio wanted (`vm`): no IOMMU
groups, or a selected GPU function not bound to vfio-pci; without (`lxc`, `baremetal`): a selected GPU
function still bound to vfio-pci. Each reason is one clause of the message operators read:
`reboot required: /proc/cmdline lacks iommu=pt; 0000:41:00.0 still bound to nvidia`.

Before any reboot of a Proxmox node (pve_host's, and the NVIDIA driver role's on a node: `RebootGuard`),
`foreign_refusal`: what it would stop that is not pvegpu's refuses it, unless
`pve_host.allow_reboot_with_foreign_guests`. pvegpu's are only the inventory's guests (`vm.vmid` a VM,
`lxc.vmid` a CT) while they carry pvegpu's mark for the inventory's owner id (the `pvegpu` tag and the
`pvegpu-owner: <id>` line, plan/ownership.py): another admin's VM at `vm.vmid` is foreign. Everything else
running, and HA services placed on the node that HA keeps started, is foreign too. Both parts of the mark
are checked: Proxmox's guest list gives the tags, and the read adds the config (the description) of the
inventory's one or two guests, one `pvesh` each (pvegpu/facts/node_guests.py), since the tag alone is
every inventory's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.models.hardware import HostHardware
from pvegpu.models.node_guests import GuestKind, HaService, NodeGuest, NodeGuests
from pvegpu.models.specs import HostSpecs
from pvegpu.plan.cmdline import HOST_P2P_PROFILES
from pvegpu.plan.ownership import Mark, guest_mark, owner_id

VFIO_DRIVER = "vfio-pci"
FOREIGN_SWITCH = "pve_host.allow_reboot_with_foreign_guests"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,63}")
_GUEST_SID = re.compile(r"(vm|ct):([0-9]+)")
_SID_KINDS: dict[str, GuestKind] = {"vm": "VM", "ct": "CT"}


@dataclass(frozen=True)
class Ours:
    """What on a node may be pvegpu's: the inventory's `guests` (kind, vmid), each only while it carries
    pvegpu's mark for `owner`."""

    owner: str
    guests: tuple[tuple[GuestKind, int], ...] = ()


@dataclass(frozen=True)
class RebootGuard:
    """What a reboot of Proxmox node `node` must pass first: the foreign-guest guard (`ours`, and the switch
    `allow_foreign`) and, when the node boots onto its own NVIDIA driver (profiles lxc, baremetal), the
    kernel guard for `driver_version` (plan/kernel_guard.py); None on `vm`."""

    node: str
    ours: Ours
    allow_foreign: bool
    driver_version: str | None


def reboot_guard(specs: HostSpecs) -> RebootGuard:
    """The guard of a reboot of the node `specs` describe (`pve_host`'s and the driver role's alike)."""
    guests: list[tuple[GuestKind, int]] = []
    if specs.vm is not None:
        guests.append(("VM", specs.vm.vmid))
    if specs.lxc is not None:
        guests.append(("CT", specs.lxc.vmid))
    node, pve = specs.node, specs.pve
    return RebootGuard(
        node.name,
        Ours(owner_id(pve.owner, pve.cluster, node.name), tuple(guests)),
        specs.host.allow_reboot_with_foreign_guests,
        specs.driver.version if node.profile in HOST_P2P_PROFILES else None,
    )


def _mark_of(guest: NodeGuest, owner: str) -> Mark:
    """`guest`'s mark as the list and its config read give it (the tags and the description)."""
    return guest_mark({"tags": guest.tags, "description": guest.description}, owner)


def _is_ours(guest: NodeGuest, ours: Ours) -> bool:
    """Whether `guest` is one of the inventory's (kind and vmid) and carries pvegpu's mark for its owner."""
    return (guest.kind, guest.vmid) in ours.guests and _mark_of(guest, ours.owner).ours


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
    listed: NodeGuests, node: str, ours: Ours
) -> tuple[tuple[NodeGuest, ...], tuple[HaService, ...]]:
    """What a reboot of `node` stops that is not pvegpu's: guests `running` that are not `ours` (the
    inventory's kind and vmid, with pvegpu's mark for its owner), and HA services placed on `node` whose
    requested state is `started` (HA keeps them running: the reboot stops or moves them) and whose guest
    is not `ours`."""
    own = {(g.kind, g.vmid) for g in listed.guests if _is_ours(g, ours)}
    guests = tuple(g for g in listed.guests if g.status == "running" and (g.kind, g.vmid) not in own)
    services = tuple(
        service
        for service in listed.ha
        if service.node == node and service.request_state == "started" and _sid_guest(service.sid) not in own
    )
    return guests, services


def foreign_summary(guests: Sequence[NodeGuest], services: Sequence[HaService], ours: Ours) -> str:
    """`running VM 300 (web), CT 301 (db); HA resources on the node: vm:300 (started)`; a guest at one of
    the inventory's vmids says what it carries instead of pvegpu's mark: `VM 100 (gpu-vm; no pvegpu
    mark)`."""
    clauses = []
    if guests:
        clauses.append("running " + ", ".join(_guest(g, ours) for g in guests))
    if services:
        shown = ", ".join(f"{_name(s.sid)} ({_name(s.state or 'unknown')})" for s in services)
        clauses.append(f"HA resources on the node: {shown}")
    return "; ".join(clauses)


def foreign_refusal(listed: NodeGuests, node: str, ours: Ours, allowed: bool) -> str | None:
    """None when the reboot of `node` may go ahead: nothing foreign runs (`foreign_running`), or `allowed`
    (the switch); else the one-line refusal naming each guest and HA resource, and the switch. A list that
    could not be read refuses too (nothing proves the node holds only pvegpu's guests)."""
    if allowed:
        return None
    if listed.problem is not None:
        return f"not rebooting {node}: {listed.problem}; or set {FOREIGN_SWITCH}: true"
    guests, services = foreign_running(listed, node, ours)
    if not guests and not services:
        return None
    return (
        f"not rebooting {node}: it would stop what is not pvegpu's: "
        f"{foreign_summary(guests, services, ours)}; stop or migrate them, or set {FOREIGN_SWITCH}: true"
    )


def _sid_guest(sid: str) -> tuple[GuestKind, int] | None:
    """`vm:100` -> ("VM", 100); None for a sid that names no guest."""
    match = _GUEST_SID.fullmatch(sid)
    return None if match is None else (_SID_KINDS[match[1]], int(match[2]))


def _guest(guest: NodeGuest, ours: Ours) -> str:
    shown = f"{guest.kind} {guest.vmid} ({_name(guest.name)}"
    if (guest.kind, guest.vmid) in ours.guests:
        shown += f"; {_mark_of(guest, ours.owner).found}"
    return shown + ")"


def _name(text: str) -> str:
    return text if _PLAIN_NAME.fullmatch(text) else repr(text)[:40]
