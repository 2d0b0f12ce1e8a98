"""Parking what the host-driver profiles left on the Proxmox host, for the profile that does not use it. Pure.

The `lxc` / `baremetal` profiles install the driver on the Proxmox host, load its modules at boot
(modules-load drop-in), turn off nvidia_uvm's HMM (modprobe drop-in), create the device nodes
(`pvegpu-nvidia-devices.service`) and, on bare metal, serve from the host (`sglang.service`). Back on `vm`
the GPUs go to vfio-pci, so whatever loads or holds the driver at boot goes: those units disabled and
stopped, pvegpu's files removed. The driver packages stay installed (dkms keeps building them for new
kernels, a switch back is quick) and are blacklisted by the vfio drop-in; SGLang's venv and the model stay
(data). On `lxc` the container serves: only the host's SGLang
service goes (it would hold the GPUs), the driver stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from pvegpu.models.host_driver import HostDriverState
from pvegpu.plan.driver import DEVICES_SERVICE, DEVICES_UNIT, MODULES_LOAD, UVM_OPTIONS
from pvegpu.plan.sglang_service import ENV_FILE, SERVICE, UNIT_FILE

PERSISTENCED = "nvidia-persistenced.service"
DRIVER_FILES = (MODULES_LOAD, UVM_OPTIONS, DEVICES_UNIT, UNIT_FILE, ENV_FILE)
DRIVER_UNITS = (SERVICE, DEVICES_SERVICE, PERSISTENCED)
# What each profile that does not serve from the host parks: (files, units).
PARKED = {
    "vm": (DRIVER_FILES, DRIVER_UNITS),
    "lxc": ((UNIT_FILE, ENV_FILE), (SERVICE,)),
}


@dataclass(frozen=True)
class HostDriverPark:
    """What parking does: units to disable (and stop), files to remove, units that run now."""

    disable: tuple[str, ...]
    remove: tuple[str, ...]
    running: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.disable and not self.remove


def plan_host_driver_park(state: HostDriverState, profile: str) -> HostDriverPark:
    """What `profile` parks (`PARKED`): each of its units that is enabled or active disabled with `--now`,
    each of its files that exists removed. Nothing for a profile that serves from the host."""
    files, units = PARKED.get(profile, ((), ()))
    mine = [unit for unit in state.units if unit.name in units]
    return HostDriverPark(
        disable=tuple(unit.name for unit in mine if unit.enabled or unit.active),
        remove=tuple(path for path in state.files if path in files),
        running=tuple(unit.name for unit in mine if unit.active),
    )
