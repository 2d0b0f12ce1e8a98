"""What the host-driver profiles (`lxc`, `baremetal`) left on a Proxmox host, as observed by
pvegpu/facts/host_driver.py: which of pvegpu's driver files exist, and the driver units' states. Plain
frozen data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UnitState:
    """A systemd unit: enabled at boot (`systemctl is-enabled`), active now (`systemctl is-active`)."""

    name: str
    enabled: bool
    active: bool


@dataclass(frozen=True)
class HostDriverState:
    """The asked-for files that exist, and the asked-for units' states (in the order asked)."""

    files: tuple[str, ...]
    units: tuple[UnitState, ...]
