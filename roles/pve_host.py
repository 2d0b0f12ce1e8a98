"""pve_host: prepare the Proxmox host for its profile: kernel command line, vfio binding, reboot, verify.

What each profile owns is in pvegpu/plan/profile.py: `vm` binds the GPUs to vfio-pci at boot (IOMMU
tokens, vfio drop-ins with the nvidia blacklist); `lxc` and `baremetal` remove what `vm` wrote (keeping
`iommu=pt`) so the host driver gets the GPUs. Switching either way reboots when the running kernel differs
and the inventory allows it, then verifies. Bad data the models cannot see (ids that match no function on
this host, a group that cannot be passed) fails while operations are collected, before any host is changed.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.facts.boot import BootLoader
from pvegpu.facts.cpu import CpuVendor, KernelRelease
from pvegpu.facts.hardware import hardware_of
from pvegpu.facts.pvegpu_boot import PvegpuBootFiles
from pvegpu.models.boot import BootLoaderKind
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.inventory import NODE_KEY, NodeSpec, spec_of
from pvegpu.operations.cmdline import cmdline_tokens
from pvegpu.operations.reboot import reboot_if_pending
from pvegpu.operations.vfio import vfio_config
from pvegpu.plan.cmdline import retired_tokens
from pvegpu.plan.errors import PlanError
from pvegpu.plan.profile import held_by_vfio, host_profile, profile_functions
from pvegpu.plan.vfio import plan_vfio


@deploy("Prepare the Proxmox host")
def pve_host() -> None:
    """Kernel command line, vfio drop-ins (written or removed) + initramfs, then reboot if pending (and
    allowed) and verify."""
    node = spec_of(host.data, NODE_KEY, NodeSpec)
    spec = spec_of(host.data, HOST_KEY, HostSpec)
    hardware = hardware_of(host, node.sysfs_root)
    try:
        profile = host_profile(node.profile, host.get_fact(CpuVendor), spec.extra_cmdline)
        functions = profile_functions(node.profile, hardware, node.gpus)
    except PlanError as error:
        raise OperationError(f"{host.name}: {error}") from None
    boot = host.get_fact(BootLoader)
    files = host.get_fact(PvegpuBootFiles)
    owned = files.grub_tokens if boot.kind is BootLoaderKind.GRUB else files.owned_tokens

    cmdline_tokens(
        name="Set the kernel command line tokens pvegpu owns", tokens=profile.tokens, boot=boot, files=files
    )
    if profile.vfio:
        vfio = plan_vfio(hardware, functions, host.get_fact(KernelRelease))
        vfio_config(name="Bind GPU functions to vfio-pci at boot", plan=vfio, files=files)
    else:
        vfio_config(
            name="Remove the vfio binding and nvidia blacklist of the vm profile", files=files, present=False
        )
    reboot_if_pending(
        name="Reboot if the running kernel lacks the boot state, and verify",
        hardware=hardware,
        tokens=profile.tokens,
        functions=functions,
        allow_reboot=spec.allow_reboot,
        retired=retired_tokens(owned, profile.tokens),
        vfio=profile.vfio,
        timeout_s=spec.reboot_timeout_s,
        sysfs_root=node.sysfs_root,
        cmdline_path=node.cmdline_path,
    )


def host_driver_blocked() -> str | None:
    """Why the host driver's steps must wait on this node (pvegpu.plan.profile.held_by_vfio), logged as a
    warning; None when they can run."""
    node = spec_of(host.data, NODE_KEY, NodeSpec)
    hardware = hardware_of(host, node.sysfs_root)
    try:
        functions = profile_functions(node.profile, hardware, node.gpus)
    except PlanError:
        return None  # pve_host reports it, naming the field
    reason = held_by_vfio(
        node.profile, hardware, functions, spec_of(host.data, HOST_KEY, HostSpec).allow_reboot
    )
    if reason is not None:
        logger.warning(f"{host.print_prefix}{reason}")
    return reason
