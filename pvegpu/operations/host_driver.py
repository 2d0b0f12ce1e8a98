"""`host_driver_parked`: the `vm` and `lxc` profiles' side of what the host-driver profiles left on the host
(pvegpu/plan/host_driver.py): on `vm` the units that load or use the driver disabled and stopped and
pvegpu's driver files removed, before the host rebinds the GPUs to vfio-pci; on `lxc` the host's SGLang.
Stopping a running unit (SGLang serving from the host) is what `pve_host.allow_reboot` allows, as stopping
the other profiles' guests; without it nothing changes and the run says what it would do.
"""

from __future__ import annotations

from collections.abc import Generator

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.plan.host_driver import plan_host_driver_park
from pvegpu.run.node_state import driver_leftovers

_NOTHING_LEFT = {
    "vm": "nothing loads or uses the NVIDIA driver on this host at boot",
    "lxc": "SGLang does not serve from this host (the container serves)",
}


@operation()
def host_driver_parked(*, profile: str, allow_stop: bool) -> Generator[StringCommand, None, None]:
    """Disable (`--now`) the driver units, remove pvegpu's driver files, reload systemd; noop when none is
    left. Units running and `allow_stop` false: nothing changed; a warning and the noop say what would be."""
    park = plan_host_driver_park(driver_leftovers(host), profile)
    if park.empty:
        host.noop(_NOTHING_LEFT.get(profile, "nothing to park"))
        return
    if park.running and not allow_stop:
        message = (
            f"profile {profile}: {', '.join(park.running)} running on the host; would stop and "
            f"disable them and remove {', '.join(park.remove) or 'nothing'} "
            "(pve_host.allow_reboot is false: not stopping them)"
        )
        logger.warning(f"{host.print_prefix}{message}")
        host.noop(message)
        return
    if park.disable:
        yield StringCommand("systemctl", "disable", "--now", *(QuoteString(unit) for unit in park.disable))
    if park.remove:
        yield StringCommand("rm", "-f", *(QuoteString(path) for path in park.remove))
        yield StringCommand("systemctl", "daemon-reload")
