"""IOMMU groups the way the Linux kernel computes them, for any laid-out topology.

This is `pci_device_group()` (drivers/iommu/iommu.c, the same in substance from 4.x to 6.x), run for each
function in probe order, with `pci_acs_enabled()` and `pci_acs_path_enabled()` (drivers/pci/pci.c):

1. Walk up from the function while the path from the bridge above it to the root bus is NOT ACS-isolated;
   each such bridge becomes the reference device; if it already has a group, join it.
2. A multifunction device without ACS joins a group of another function of its slot that has no ACS either.
3. Otherwise a new group, numbered in probe order.

What `pci_acs_enabled()` says of one function: root and downstream ports: their ACS; PCIe-to-PCI bridges
and functions without a PCIe capability: never; endpoints and upstream ports: isolated when single-function,
else their ACS. The kernel's first step, the DMA-alias walk (`pci_for_each_dma_alias()`: what sits behind a
PCIe-to-PCI bridge uses the bridge's requester id), lands on the same group here: such a bridge never has
ACS and is probed before what is behind it, so step 1 reaches it too. Not modelled: device-specific DMA-alias
quirks (`dma_alias_mask`).

Calibrated against a real 6.1 kernel: tests/unit/lab/test_fakesys.py (shared/fixtures/real-kernel) and the
kernel
tier (tests/kernel), which boots any topology under QEMU and compares.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.topology import Kind, Placed


def acs_enabled(function: Placed) -> bool:
    """pci_acs_enabled(dev, REQ_ACS_FLAGS) for one function."""
    kind = function.function.kind
    if kind in (Kind.PCI_BRIDGE, Kind.CONVENTIONAL):
        return False
    if kind in (Kind.ROOT_PORT, Kind.DOWNSTREAM):
        return function.function.acs
    return function.function.acs if function.multifunction else True


def iommu_groups(functions: Sequence[Placed]) -> dict[str, int]:
    """The group number of every function the IOMMU covers, by address; `functions` in probe order
    (as `lab.topology.place` returns them). Functions with `iommu_scope=False` get none."""
    by_address = {f.address: f for f in functions}
    group: dict[str, int] = {}

    def parent(function: Placed) -> Placed | None:
        return by_address[function.parents[-1]] if function.parents else None

    def acs_path_enabled(function: Placed | None) -> bool:
        while function is not None:
            if not acs_enabled(function):
                return False
            function = parent(function)
        return True

    def device_group(function: Placed) -> int | None:
        reference = function
        # 1. Up to the point where devices are protected from peer-to-peer DMA by ACS.
        bridge = parent(reference)
        while bridge is not None and not acs_path_enabled(bridge):
            reference = bridge
            if bridge.address in group:
                return group[bridge.address]
            bridge = parent(bridge)
        # 2. get_pci_function_alias_group(): the other non-isolated functions of a multifunction slot.
        if reference.multifunction and not acs_enabled(reference):
            for other in functions:
                if (
                    other is not reference
                    and other.slot_address == reference.slot_address
                    and not acs_enabled(other)
                    and other.address in group
                ):
                    return group[other.address]
        return None

    next_group = 0
    for function in functions:
        if not function.function.iommu_scope:
            continue
        found = device_group(function)
        if found is None:
            found, next_group = next_group, next_group + 1
        group[function.address] = found
    return group
