"""`vm_parked`: the `lxc` and `baremetal` profiles' side of the managed VM: stopped, and not started at boot
(`onboot: 0`), so the host driver gets the GPUs. Back to `vm`, `q35_vm` sets `onboot: 1` again and
`vm_running` starts it.

Only the inventory's VM (`vm.vmid`), and only when its config maps pvegpu's GPUs (a `hostpciN` with
`mapping=<prefix>N`): any other VM, and the mappings, are left alone. Stopping a running VM is what an
operator allowed with `pve_host.allow_reboot` (the switch takes the GPUs away from it, as a reboot would);
without that, nothing is stopped and the operation says what it would do.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping

from pyinfra.api.command import FunctionCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.operations.park import Guest, park
from pvegpu.operations.vm import vm_config_or_none
from pvegpu.pve import PveClient


def maps_gpus(values: Mapping[str, object], prefix: str) -> bool:
    """Whether a VM config has a `hostpciN` whose `mapping=` is one of pvegpu's (`<prefix>N`)."""
    mapping = re.compile(rf"(?:^|,)mapping={re.escape(prefix)}\d+(?:,|$)")
    return any(
        re.fullmatch(r"hostpci\d+", key) is not None and mapping.search(str(value)) is not None
        for key, value in values.items()
    )


@operation()
def vm_parked(
    *,
    api: PveClient,
    node: str,
    vmid: int,
    prefix: str,
    profile: str,
    allow_stop: bool,
    timeout_s: float,
) -> Generator[FunctionCommand, None, None]:
    """Set `onboot: 0` (PUT with the read's digest) and stop VM `vmid` when it runs, for `profile`.

    Noop when the VM does not exist, is not pvegpu's (module docstring), or is stopped with `onboot: 0`.
    Running and `allow_stop` false: nothing changed; a warning and the noop say what would be done.
    """
    config = vm_config_or_none(api, node, vmid)
    if config is None:
        host.noop(f"VM {vmid} does not exist on {node}: no VM holds the GPUs")
        return
    if not maps_gpus(config.values, prefix):
        host.noop(f"VM {vmid} on {node} maps none of pvegpu's {prefix}N mappings: not pvegpu's, left alone")
        return
    yield from park(
        api, Guest.vm(api, node, vmid), config, profile=profile, allow_stop=allow_stop, timeout_s=timeout_s
    )
