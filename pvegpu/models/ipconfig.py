"""Proxmox's `ipconfigN` cloud-init property string, checked as qemu-server checks it. Pure.

    ip=dhcp                                  ip=10.0.0.5/24,gw=10.0.0.1          ip6=auto
    ip=10.0.0.5/24,gw=10.0.0.1,ip6=fd00::5/64,gw6=fd00::1

Keys (qemu-server `$ipconfig_fmt`): `ip` = `dhcp` or IPv4/CIDR, `gw` = IPv4 (needs a static `ip`), `ip6` =
`dhcp`, `auto` or IPv6/CIDR, `gw6` = IPv6 (needs a static `ip6`). Unknown or repeated keys are refused.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pvegpu.models.fields import shown

_KEYS = ("ip", "gw", "ip6", "gw6")


@dataclass(frozen=True)
class IpConfig:
    """A parsed ipconfig: each key's text as given, None when absent."""

    ip: str | None
    gw: str | None
    ip6: str | None
    gw6: str | None


def parse_ipconfig(text: str) -> IpConfig:
    """The keys of `text` (module docstring); ValueError naming the first problem."""
    values: dict[str, str] = {}
    for part in text.split(","):
        key, equals, value = part.partition("=")
        if key not in _KEYS or not equals:
            raise ValueError(f"{shown(part)} is not one of ip=, gw=, ip6=, gw6= (Proxmox ipconfig0)")
        if key in values:
            raise ValueError(f"{key}= is given twice")
        values[key] = value
    config = IpConfig(values.get("ip"), values.get("gw"), values.get("ip6"), values.get("gw6"))
    _check_address("ip", config.ip, ipaddress.IPv4Interface, ("dhcp",))
    _check_address("ip6", config.ip6, ipaddress.IPv6Interface, ("dhcp", "auto"))
    _check_gateway("gw", config.gw, "ip", config.ip, ipaddress.IPv4Address)
    _check_gateway("gw6", config.gw6, "ip6", config.ip6, ipaddress.IPv6Address)
    return config


def check_ipconfig(text: str) -> str:
    """`text` if it parses (pydantic validator); else ValueError."""
    parse_ipconfig(text)
    return text


def static_interface(config: IpConfig) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface | None:
    """The static IPv4 interface, else the static IPv6 one, else None (DHCP / SLAAC)."""
    if config.ip not in (None, "dhcp"):
        return ipaddress.IPv4Interface(config.ip)
    if config.ip6 not in (None, "dhcp", "auto"):
        return ipaddress.IPv6Interface(config.ip6)
    return None


def _check_address(
    key: str,
    value: str | None,
    kind: type[ipaddress.IPv4Interface | ipaddress.IPv6Interface],
    words: tuple[str, ...],
) -> None:
    if value is None or value in words:
        return
    try:
        if "/" not in value:
            raise ValueError
        kind(value)
    except ValueError:
        family = "IPv4" if kind is ipaddress.IPv4Interface else "IPv6"
        raise ValueError(
            f"{key}={value} is not {' or '.join(words)} or an {family} address with its prefix "
            f"(e.g. {'10.0.0.5/24' if family == 'IPv4' else 'fd00::5/64'})"
        ) from None


def _check_gateway(
    key: str,
    value: str | None,
    address_key: str,
    address: str | None,
    kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address],
) -> None:
    if value is None:
        return
    try:
        kind(value)
    except ValueError:
        family = "IPv4" if kind is ipaddress.IPv4Address else "IPv6"
        raise ValueError(f"{key}={value} is not an {family} address") from None
    if address is None or "/" not in address:
        given = "none is given" if address is None else f"got {address_key}={address}"
        raise ValueError(f"{key}= needs a static {address_key}= address ({given})")
