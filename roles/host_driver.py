"""host_driver_parked: what the host-driver profiles left on the host, parked for a profile that does not
use it (pvegpu/plan/host_driver.py says what and why): on `vm` the driver no longer loads or serves at boot
(units disabled and stopped, pvegpu's driver files removed; the vfio drop-in pve_host writes next
blacklists the module and its reboot unloads it); on `lxc` the host's SGLang stops (the container serves)."""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.operations.host_driver import host_driver_parked
from pvegpu.run.plan import plan_of


@deploy("Park what the host-driver profiles left on the host")
def host_driver_parked_role() -> None:
    plan = plan_of(host)
    host_driver_parked(
        name="Stop and disable what this profile does not use on the host",
        profile=plan.profile,
        allow_stop=plan.specs.host.allow_reboot,
    )
