"""What each profile owns on the Proxmox host, so what switching to another profile undoes. Pure.

- `vm`: pvegpu's command line tokens `<vendor>_iommu=on iommu=pt` + extras; the vfio drop-ins (with the
  nvidia blacklist) present; the GPU functions bound to vfio-pci at boot; the managed VM converged with
  `onboot: 1` and running.
- `lxc`, `baremetal`: tokens `iommu=pt` + extras; the vfio drop-ins absent; no GPU function bound to
  vfio-pci (the host's nvidia driver takes them when installed); the managed VM stopped, `onboot: 0`.

The vfio drop-ins are /etc/modules-load.d/pvegpu-vfio.conf and /etc/modprobe.d/pvegpu-vfio.conf; the
second also blacklists NVIDIA's and the in-tree GPU modules, so removing it is what lets the host driver
bind again. Tokens and files pvegpu did not write are never touched; the VM is only the inventory's
`vm.vmid`, and only when its config maps pvegpu's GPUs (see pvegpu/operations/pve_guest.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.models.groups import BAREMETAL_HOSTS, LXC_GUESTS, PVE_NODES, VM_GUESTS
from pvegpu.models.hardware import HostHardware
from pvegpu.models.node import GpuSelector
from pvegpu.plan.cmdline import desired_tokens
from pvegpu.plan.driver import Placement
from pvegpu.plan.topology import Topology, require_gpus
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


def profile_functions(
    profile: str, hw: HostHardware, topology: Topology, selector: GpuSelector
) -> tuple[str, ...]:
    """The GPU functions whose binding the profile decides, sorted; `topology` is `plan_topology(hw,
    selector)`.

    `vm`: every non-bridge member of each GPU's IOMMU group (`selected_functions`, which refuses a group
    that cannot be passed). `lxc` / `baremetal`: every function of each GPU card; IOMMU grouping does not
    matter to the host driver, so nothing is refused for it. Raises PlanError naming the field when the
    selector matches no function (`node.gpus.ids`) or another number than declared (`node.gpus.count`).
    """
    require_gpus(topology, selector)
    if profile == "vm":
        return selected_functions(hw, topology)
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


@dataclass(frozen=True)
class NodeSteps:
    """What deploy/site.py does on a Proxmox node of `profile`, in this order: the old profile's guests let
    go of the GPUs (`park_container`, `park_vm`) and the host driver's boot units go (`park_host_driver`)
    before the host rebinds the GPUs; then the host; then the profile's own steps. `waiting` says why the
    host driver and what needs it wait (the GPUs stay on vfio-pci until a reboot that is not allowed)."""

    park_container: bool
    park_vm: bool
    park_host_driver: bool
    vm: bool
    host_driver: bool
    container: bool
    waiting: str | None


def node_steps(profile: str, *, has_container: bool, waiting: str | None) -> NodeSteps:
    """The steps of a node on `profile`; `has_container`: the node declares `lxc` data (a managed
    container); `waiting`: `held_by_vfio`'s reason, or None."""
    ready = profile != "vm" and waiting is None
    return NodeSteps(
        park_container=has_container and profile != "lxc",
        park_vm=profile != "vm",
        park_host_driver=profile != "baremetal",
        vm=profile == "vm",
        host_driver=ready,
        container=ready and profile == "lxc",
        waiting=waiting,
    )


@dataclass(frozen=True)
class ServingSteps:
    """What a serving host gets: the NVIDIA driver at `driver`'s placement (None: a Proxmox node's own
    steps installed it) and the SGLang service (`sglang`: False while the node's driver waits)."""

    driver: Placement | None
    sglang: bool


def serving_steps(groups: frozenset[str], waiting: str | None) -> ServingSteps | None:
    """The serving steps of a host in `groups` (None: it serves nothing). A VM's guest gets the driver with
    its module; a container userspace only; a bare-metal host that is also a Proxmox node already got its
    driver from the node's steps (and waits with them); one that is not gets it here."""
    if VM_GUESTS in groups:
        return ServingSteps(driver="guest", sglang=True)
    if LXC_GUESTS in groups:
        return ServingSteps(driver="container", sglang=True)
    if BAREMETAL_HOSTS in groups:
        if PVE_NODES in groups:
            return ServingSteps(driver=None, sglang=waiting is None)
        return ServingSteps(driver="guest", sglang=True)
    return None
