"""The VM's `hostpciN` entries: one `mapping=<id>,pcie=1` per GPU mapping, and the change to make. Pure.

Format: qemu-server's `pve-qm-hostpci` property string (shared/knowledge/proxmox-hostpci-vm-config.md §2):
`host` is the default key (may be given bare), exactly one of host/mapping, booleans accept
`1|on|yes|true` / `0|off|no|false`. `canonical_hostpci` prints it the way Proxmox stores it: the default
key bare first, then the other keys sorted, booleans `0`/`1` (`mapping=gpu0,pcie=1`).

Ownership: pvegpu owns the `hostpciN` entries whose mapping is of its scheme (`<prefix><N>`). A slot it
needs that holds anything else (a NIC by `host=`, another mapping) is refused, never overwritten; its own
entries beyond the GPUs wanted are deleted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.pve import CONFIG_ID
from pvegpu.plan.errors import PlanError
from pvegpu.plan.mapping import managed_index

MAX_HOSTPCI = 16
HOSTPCI_KEY = re.compile(r"hostpci(1[0-5]|[0-9])")

_HOST = re.compile(
    r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?(?:;(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?)*"
)
_HEX_ID = re.compile(r"0x[0-9a-fA-F]{4}")
_TRUE, _FALSE = ("1", "on", "yes", "true"), ("0", "off", "no", "false")
BOOLEANS = ("legacy-igd", "pcie", "rombar", "x-vga")
_PATTERNS: dict[str, re.Pattern[str]] = {
    "host": _HOST,
    "mapping": CONFIG_ID,
    "romfile": re.compile(r"[^,;]+"),
    "mdev": re.compile(r"[^/.:]+"),
    "vendor-id": _HEX_ID,
    "device-id": _HEX_ID,
    "sub-vendor-id": _HEX_ID,
    "sub-device-id": _HEX_ID,
    "driver": re.compile(r"vfio|keep"),
}
KEYS = (*BOOLEANS, *_PATTERNS)


class HostPciError(PlanError):
    """A hostpci value Proxmox would refuse, or a slot pvegpu must not take; the message says which."""


def parse_hostpci(value: str) -> dict[str, str]:
    """The keys of one hostpciN value, booleans normalised to `0`/`1`; raises HostPciError."""
    keys: dict[str, str] = {}
    for part in value.split(","):
        if not part.strip():
            continue
        key, sep, item = part.partition("=")
        if not sep:
            key, item = "host", part  # the default key
        if key not in KEYS:
            raise HostPciError(f"invalid key in comma-separated list property: {key}")
        if key in keys:
            raise HostPciError(f"duplicate key in comma-separated list property: {key}")
        if key in BOOLEANS:
            if item.lower() not in _TRUE + _FALSE:
                raise HostPciError(f"{key}: type check ('boolean') failed - got '{item}'")
            item = "1" if item.lower() in _TRUE else "0"
        elif not _PATTERNS[key].fullmatch(item):
            raise HostPciError(f"{key}: value does not match the regex pattern")
        keys[key] = item
    if "host" in keys and "mapping" in keys:
        raise HostPciError("Cannot set both 'host' and 'mapping'.")
    if "host" not in keys and "mapping" not in keys:
        raise HostPciError("Either 'host' or 'mapping' must be set.")
    return keys


def canonical_hostpci(keys: Mapping[str, str]) -> str:
    """Proxmox's stored form: `host` bare first, then every other key sorted."""
    parts = [keys["host"]] if "host" in keys else []
    parts.extend(f"{key}={keys[key]}" for key in sorted(keys) if key != "host")
    return ",".join(parts)


def desired_hostpci(mapping_ids: Sequence[str]) -> dict[str, str]:
    """`{"hostpci0": "mapping=gpu0,pcie=1", ...}`: one PCIe device per mapping, in order (q35 needed)."""
    if len(mapping_ids) > MAX_HOSTPCI:
        raise HostPciError(f"{len(mapping_ids)} GPUs, but a VM has at most {MAX_HOSTPCI} hostpci devices")
    return {f"hostpci{n}": f"mapping={mapping},pcie=1" for n, mapping in enumerate(mapping_ids)}


@dataclass(frozen=True)
class HostPciChange:
    """Keys to set (value as Proxmox stores it) and pvegpu's own keys to delete; both empty: no change."""

    set: dict[str, str]
    delete: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete)


def diff_hostpci(desired: Mapping[str, str], current: Mapping[str, object], prefix: str) -> HostPciChange:
    """Compare `desired` (from desired_hostpci) with a VM config's keys.

    A current value equal in meaning (`pcie=on` vs `pcie=1`, any key order) is unchanged. A desired slot
    holding something not pvegpu's raises HostPciError naming it. pvegpu's entries in slots not desired
    are deleted; every other hostpciN is left alone.
    """
    to_set: dict[str, str] = {}
    for key, value in desired.items():
        wanted = canonical_hostpci(parse_hostpci(value))
        now = current.get(key)
        if now is None:
            to_set[key] = wanted
            continue
        keys = _parsed_or_none(str(now))
        if keys is None or not _ours(keys, prefix):
            raise HostPciError(
                f"{key} holds {now!r}, which is not a {prefix}<N> mapping: free the slot first"
            )
        if canonical_hostpci(keys) != wanted:
            to_set[key] = wanted
    delete = []
    for key, held in current.items():
        if HOSTPCI_KEY.fullmatch(key) and key not in desired:
            keys = _parsed_or_none(str(held))
            if keys is not None and _ours(keys, prefix):
                delete.append(key)
    return HostPciChange(to_set, tuple(sorted(delete, key=lambda k: int(k.removeprefix("hostpci")))))


def _parsed_or_none(value: str) -> dict[str, str] | None:
    try:
        return parse_hostpci(value)
    except HostPciError:
        return None


def _ours(keys: Mapping[str, str], prefix: str) -> bool:
    mapping = keys.get("mapping")
    return mapping is not None and managed_index(prefix, mapping) is not None
