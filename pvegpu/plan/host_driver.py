"""Parking the host's NVIDIA driver for the `vm` profile. Pure.

The `lxc` / `baremetal` profiles install the driver on the Proxmox host, load its modules at boot
(modules-load drop-in), create the device nodes (`pvegpu-nvidia-devices.service`) and, on bare metal, serve
from the host (`sglang.service`). Back on `vm` the GPUs go to vfio-pci, so whatever loads or holds the
driver at boot goes: those units disabled and stopped, pvegpu's files removed. The driver packages stay
installed (dkms keeps building them for new kernels, a switch back is quick) and are blacklisted by the vfio
drop-in; SGLang's venv and the model stay (data).
"""

from __future__ import annotations

from dataclasses import dataclass

from pvegpu.plan.driver import DEVICES_SERVICE, DEVICES_UNIT, MODULES_LOAD
from pvegpu.plan.sglang_service import ENV_FILE, SERVICE, UNIT_FILE

PERSISTENCED = "nvidia-persistenced.service"
DRIVER_FILES = (MODULES_LOAD, DEVICES_UNIT, UNIT_FILE, ENV_FILE)
DRIVER_UNITS = (SERVICE, DEVICES_SERVICE, PERSISTENCED)


@dataclass(frozen=True)
class UnitState:
    name: str
    enabled: bool
    active: bool


@dataclass(frozen=True)
class HostDriverState:
    """pvegpu's driver files that exist, and the driver units' states (in `DRIVER_UNITS` order)."""

    files: tuple[str, ...]
    units: tuple[UnitState, ...]


@dataclass(frozen=True)
class HostDriverPark:
    """What parking does: units to disable (and stop), files to remove, units that run now."""

    disable: tuple[str, ...]
    remove: tuple[str, ...]
    running: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.disable and not self.remove


def plan_host_driver_park(state: HostDriverState) -> HostDriverPark:
    """Every enabled or active driver unit disabled with `--now`; every pvegpu driver file removed."""
    return HostDriverPark(
        disable=tuple(unit.name for unit in state.units if unit.enabled or unit.active),
        remove=state.files,
        running=tuple(unit.name for unit in state.units if unit.active),
    )
