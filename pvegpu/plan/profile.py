"""What each profile owns on the Proxmox host, so what switching to another profile undoes. Pure.

- `vm`: pvegpu's command line tokens `<vendor>_iommu=on iommu=pt` + extras; the vfio drop-ins (with the
  nvidia blacklist) present; the GPU functions bound to vfio-pci at boot; the managed VM converged with
  `onboot: 1` and running.
- `lxc`, `baremetal`: tokens `iommu=pt` + extras; the vfio drop-ins absent; no GPU function bound to
  vfio-pci (the host's nvidia driver takes them when installed); the managed VM stopped, `onboot: 0`.

The vfio drop-ins are /etc/modules-load.d/pvegpu-vfio.conf and /etc/modprobe.d/pvegpu-vfio.conf; the
second also blacklists NVIDIA's and the in-tree GPU modules, so removing it is what lets the host driver
bind again. Tokens and files pvegpu did not write are never touched; the VM is only the inventory's
`vm.vmid`, and only when its config maps pvegpu's GPUs (see pvegpu/operations/vm_parked.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.models.hardware import HostHardware
from pvegpu.models.inventory import GpuSelector
from pvegpu.plan.cmdline import desired_tokens
from pvegpu.plan.errors import PlanError
from pvegpu.plan.topology import plan_topology
from pvegpu.plan.vfio import selected_functions


@dataclass(frozen=True)
class HostProfile:
    """The host state of one profile: pvegpu's command line tokens, whether the vfio drop-ins exist (and
    the selected GPU functions must be bound to vfio-pci), whether the managed VM runs."""

    profile: str
    tokens: tuple[str, ...]
    vfio: bool
    vm_running: bool


def host_profile(profile: str, cpu_vendor: str | None, extra: Sequence[str]) -> HostProfile:
    """The host state `profile` owns on a CPU of `cpu_vendor`, with the operator's `extra` tokens.

    Raises PlanError (from `desired_tokens`) for an unknown profile, or `vm` on an unknown CPU vendor.
    """
    vm = profile == "vm"
    return HostProfile(
        profile=profile, tokens=desired_tokens(profile, cpu_vendor, extra), vfio=vm, vm_running=vm
    )


def profile_functions(profile: str, hw: HostHardware, selector: GpuSelector) -> tuple[str, ...]:
    """The GPU functions whose binding the profile decides, sorted.

    `vm`: every non-bridge member of each GPU's IOMMU group (`selected_functions`, which refuses a group
    that cannot be passed). `lxc` / `baremetal`: every function of each GPU card; IOMMU grouping does not
    matter to the host driver, so nothing is refused for it. Raises PlanError naming the field when the
    selector matches no function (`node.gpus.ids`) or another number than declared (`node.gpus.count`).
    """
    if profile == "vm":
        return selected_functions(hw, selector)
    topology = plan_topology(hw, selector)
    if not topology.gpus:
        raise PlanError(f"node.gpus.ids: {', '.join(selector.ids)} matches no display function on this host")
    if topology.problems:
        raise PlanError("node.gpus.count: " + "; ".join(topology.problems))
    return tuple(sorted(address for gpu in topology.gpus for address in gpu.functions))


def held_by_vfio(profile: str, hw: HostHardware, functions: Sequence[str], allow_reboot: bool) -> str | None:
    """Why the host driver cannot take the GPUs in this run (None when it can): on `lxc` / `baremetal`, GPU
    functions still bound to vfio-pci free only at a reboot, which `allow_reboot` false forbids."""
    if profile == "vm" or allow_reboot:
        return None
    held = [address for address in functions if hw.by_address[address].driver == "vfio-pci"]
    if not held:
        return None
    return (
        f"profile {profile}: {', '.join(held)} still bound to vfio-pci until the host reboots "
        "(pve_host.allow_reboot is false): not installing the host driver or serving yet"
    )
