"""pve_host: prepare the Proxmox host for its profile: kernel command line, vfio binding, reboot, verify.

What each profile owns is in pvegpu/plan/profile.py: `vm` binds the GPUs to vfio-pci at boot (IOMMU
tokens, vfio drop-ins with the nvidia blacklist); `lxc` and `baremetal` remove what `vm` wrote (keeping
`iommu=pt`) so the host driver gets the GPUs. Switching either way reboots when the running kernel differs
and the inventory allows it, then verifies. Bad data the models cannot see (ids that match no function on
this host, a group that cannot be passed) fails while operations are collected, before any host is changed.
"""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.operations.cmdline import cmdline_tokens
from pvegpu.operations.reboot import reboot_if_pending, reboot_planned, refuse_node_reboot
from pvegpu.operations.vfio import vfio_config
from pvegpu.run.node_state import node_state_of
from pvegpu.run.plan import plan_of


@deploy("Prepare the Proxmox host")
def pve_host() -> None:
    """Kernel command line, vfio drop-ins (written or removed) + initramfs, then reboot if pending (and
    allowed) and verify."""
    plan = plan_of(host)
    guard = plan.reboot_guard  # set with `host`: both a Proxmox node's
    if plan.problem is not None or plan.host is None or guard is None:
        raise OperationError(f"{host.name}: {plan.problem}")
    node, spec, profile = plan.specs.node, plan.specs.host, plan.host
    state = node_state_of(host)
    boot, files = state.boot, state.boot_files
    if spec.allow_reboot and reboot_planned(
        host,
        hardware=plan.hardware,
        tokens=profile.tokens,
        functions=plan.functions,
        retired=plan.retired,
        vfio=profile.vfio,
        cmdline_path=node.cmdline_path,
    ):
        # Refused here, while operations are collected: nothing of this run is written yet.
        refuse_node_reboot(host, guard)

    cmdline_tokens(
        name="Set the kernel command line tokens pvegpu owns",
        tokens=profile.tokens,
        boot=boot,
        files=files,
        cmdline_path=node.cmdline_path,
    )
    if plan.vfio is not None:
        vfio_config(name="Bind GPU functions to vfio-pci at boot", plan=plan.vfio, files=files)
    else:
        vfio_config(
            name="Remove the vfio binding and nvidia blacklist of the vm profile", files=files, present=False
        )
    reboot_if_pending(
        name="Reboot if the running kernel lacks the boot state, and verify",
        hardware=plan.hardware,
        tokens=profile.tokens,
        functions=plan.functions,
        allow_reboot=spec.allow_reboot,
        retired=plan.retired,
        vfio=profile.vfio,
        cmdline_path=node.cmdline_path,
        timeout_s=spec.reboot_timeout_s,
        sysfs_root=node.sysfs_root,
        guard=guard,
    )
