"""host_driver_parked: back on the `vm` profile, the host's NVIDIA driver no longer loads or serves at boot
(units disabled and stopped, pvegpu's driver files removed; pvegpu/plan/host_driver.py says what and why).
The vfio drop-in pve_host writes next blacklists the module, and its reboot unloads it."""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.inventory import spec_of
from pvegpu.operations.host_driver import host_driver_parked
from roles.pci_mapping import node_of


@deploy("Park the host's NVIDIA driver for the vm profile")
def host_driver_parked_role() -> None:
    allowed = host.data.get(HOST_KEY)
    host_driver_parked(
        name="Stop and disable what loads or uses the host driver at boot",
        profile=node_of(host).profile,
        allow_stop=spec_of({} if allowed is None else {HOST_KEY: allowed}, HOST_KEY, HostSpec).allow_reboot,
    )
