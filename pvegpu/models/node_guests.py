"""What runs on a Proxmox node, as its API lists it: the guests (`GET /nodes/{node}/qemu`, `/lxc`) and the
HA services (`GET /cluster/ha/status/current`), with the description of the inventory's own guests
(`GET .../{vmid}/config`). Read only before a reboot pvegpu triggers (pvegpu/facts/node_guests.py); decided
on by pvegpu/plan/reboot.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GuestKind = Literal["VM", "CT"]


@dataclass(frozen=True)
class NodeGuest:
    """One entry of a node's guest list: `kind` `VM` (qemu) or `CT` (lxc), `status` as Proxmox says it
    (`running`, `stopped`), `name` (a VM's `name` or `VM <vmid>`, a CT's hostname or `CT<vmid>`), `tags`
    as the list gives them (the config's `tags`, e.g. `pvegpu;web`; None without). `description`: the
    config's, read only for the guests the read was asked about (the inventory's own); None otherwise, or
    when that read failed."""

    kind: GuestKind
    vmid: int
    name: str
    status: str
    tags: str | None = None
    description: str | None = None


@dataclass(frozen=True)
class HaService:
    """One `service` entry of the HA status: `sid` (`vm:100`, `ct:101`), the `node` it is placed on, the
    requested state (`request_state`: started, stopped, disabled, ignored) and the CRM's verbose `state`."""

    sid: str
    node: str | None
    request_state: str | None
    state: str | None


@dataclass(frozen=True)
class NodeGuests:
    """The node's guests and the cluster's HA services; `problem`: why they could not be listed (then the
    lists are empty and a reboot is refused)."""

    guests: tuple[NodeGuest, ...] = ()
    ha: tuple[HaService, ...] = ()
    problem: str | None = None
