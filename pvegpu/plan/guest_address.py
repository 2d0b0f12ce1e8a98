"""Which address a DHCP guest is reached at: the one its QEMU guest agent reports on the NIC with net0's MAC.

The guest (its agent) is not pvegpu's to trust: the address goes into the operator's known_hosts file and
becomes the host pyinfra connects to. So it must be an IPv4 address a guest can be reached at over its NIC:
not loopback (the operator's own machine), unspecified, multicast, link-local or reserved. Another interface's
address, whatever it is, is never taken.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from pvegpu.models.fields import shown
from pvegpu.models.pve import GuestInterface


class GuestAddressError(ValueError):
    """The agent reports on net0 only what pvegpu will not connect to; the message says what and why."""


def net0_address(interfaces: Sequence[GuestInterface], mac: str, vmid: int) -> str | None:
    """The first usable IPv4 address the agent reports on the interface with MAC `mac` (net0's); None while
    it reports none there (the guest is still booting). GuestAddressError when it reports addresses there
    and none is usable (module docstring), naming the first."""
    nic = next((nic for nic in interfaces if nic.mac.lower() == mac.lower()), None)
    if nic is None or not nic.ipv4:
        return None
    refusals = []
    for entry in nic.ipv4:
        text = entry.split("/")[0]
        why = _unusable(text)
        if why is None:
            return text
        refusals.append(f"VM {vmid}'s guest agent reports {shown(text)} on net0 ({mac.lower()}), {why}")
    raise GuestAddressError(refusals[0])


def _unusable(text: str) -> str | None:
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        return "which is not an IPv4 address"
    for kind, found in (
        ("a loopback", address.is_loopback),
        ("an unspecified", address.is_unspecified),
        ("a multicast", address.is_multicast),
        ("a link-local", address.is_link_local),
        ("a reserved", address.is_reserved),
    ):
        if found:
            return f"{kind} address pvegpu will not connect to"
    return None
