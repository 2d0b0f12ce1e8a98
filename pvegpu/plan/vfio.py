"""Which PCI functions go to vfio-pci at boot, and how the modprobe configuration says so. Pure.

The functions are every non-bridge member of each selected GPU's IOMMU group (the GPU and its audio
function: VFIO needs the whole group). `options vfio-pci ids=` binds every function with those ids, so it is
used only when no other function on the host shares one; otherwise (some of several identical cards
selected) each function is bound by address through `driver_override` when vfio-pci loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from pvegpu.models.hardware import HostHardware
from pvegpu.plan.errors import PlanError
from pvegpu.plan.topology import Topology, Verdict

BASE_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
# vfio_virqfd was merged into vfio in Linux 6.2; the module does not exist from there on.
VIRQFD_MODULE = "vfio_virqfd"
VIRQFD_MERGED_IN = (6, 2)
# Loaded after vfio-pci, so vfio-pci claims the functions first.
SOFTDEP_MODULES = ("nouveau", "nvidia")
# The `vm` profile keeps the host's NVIDIA drivers away from the GPUs altogether. modprobe blacklists take
# module names, not patterns: these are the modules of NVIDIA's driver (nvidia*) and the in-tree ones.
BLACKLIST_VM = ("nouveau", "nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidiafb")


@dataclass(frozen=True)
class VfioPlan:
    """The vfio boot configuration. Exactly one of `ids` / `addresses` is non-empty."""

    functions: tuple[str, ...]
    modules: tuple[str, ...]
    ids: tuple[str, ...]
    addresses: tuple[str, ...]
    softdeps: tuple[str, ...]
    blacklist: tuple[str, ...]


def selected_functions(hw: HostHardware, topology: Topology) -> tuple[str, ...]:
    """Addresses of the non-bridge members of every GPU's IOMMU group in `topology`, sorted.

    Raises PlanError naming the field (`node.gpus`) for a GPU whose group cannot be passed.
    """
    refused = [
        f"{gpu.name} ({gpu.address}): {gpu.reason}" for gpu in topology.gpus if gpu.verdict is Verdict.REFUSED
    ]
    if refused:
        raise PlanError("node.gpus: " + "; ".join(refused))
    addresses: set[str] = set()
    for gpu in topology.gpus:
        members = hw.group_members(gpu.iommu_group) if gpu.iommu_group is not None else ()
        addresses.update(f.address for f in members if not f.is_bridge)
        addresses.update(gpu.functions)
    return tuple(sorted(addresses))


def plan_vfio(hw: HostHardware, functions: tuple[str, ...], kernel: tuple[int, int]) -> VfioPlan:
    """Modules to load, and ids or addresses for vfio-pci, for the `vm` profile on a kernel `kernel`."""
    modules = BASE_MODULES + ((VIRQFD_MODULE,) if kernel < VIRQFD_MERGED_IN else ())
    ids = sorted({hw.by_address[address].id for address in functions})
    shared = [f for f in hw.functions if f.id in ids and f.address not in functions]
    return VfioPlan(
        functions=functions,
        modules=modules,
        ids=() if shared else tuple(ids),
        addresses=functions if shared else (),
        softdeps=SOFTDEP_MODULES,
        blacklist=BLACKLIST_VM,
    )
