"""guest_parked_role: a managed guest the profile in use does not run, stopped and not started at boot
(`onboot: 0`) so that the profile in use gets the GPUs: the Q35 VM on `lxc` / `baremetal`, the container on
`vm` / `baremetal`, each only while it carries pvegpu's mark (pvegpu/plan/ownership.py; or `vm.adopt` /
`lxc.adopt`): another guest at that vmid is left alone, said so. A VM is shut down cleanly, stopped only
when the shutdown times out. Never deleted:
back on its own profile, `q35_vm_role` / `lxc_gpu` set `onboot: 1` again and start it.

Stopping a running guest takes the GPUs away from it, as a reboot would: only with
`pve_host.allow_reboot`; without it nothing is stopped and the run says what it would do.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.models.lxc import LXC_KEY
from pvegpu.models.vm import VM_KEY
from pvegpu.operations.pve_guest import CT, VM, Guest, GuestKind, Ownership, guest_parked
from pvegpu.pve.host_client import pve_client
from pvegpu.run.plan import plan_of

# Each kind's deploy name, and the host data key that declares its managed guest.
_PARKING: dict[GuestKind, tuple[str, str]] = {
    VM: ("Stop the Q35 VM for a host-driver profile", VM_KEY),
    CT: ("Stop the GPU container for another profile", LXC_KEY),
}


def guest_parked_role(kind: GuestKind) -> None:
    """Park the host's managed guest of `kind` (`VM` or `CT`, pvegpu/operations/pve_guest.py). A host
    without its data (`vm` / `lxc`) has no such guest: nothing to do, and the run says so."""
    title, key = _PARKING[kind]

    @deploy(title)
    def parked() -> None:
        plan = plan_of(host)
        specs = plan.specs
        vm = specs.vm if kind is VM else None
        spec = vm if kind is VM else specs.lxc
        if spec is None:
            logger.info(
                f"{host.print_prefix}no `{key}` data: no managed {kind.holder} to stop for profile "
                f"{specs.node.profile}"
            )
            return
        guest_parked(
            name=f"Stop the {kind.holder} and keep it from starting at boot",
            guest=Guest(kind, pve_client(host), specs.node.name, spec.vmid),
            ownership=Ownership(plan.owner, spec.adopt, f"{key}.adopt"),
            profile=specs.node.profile,
            allow_stop=specs.host.allow_reboot,
            timeout_s=specs.pve.task_timeout_s,
        )

    parked()
