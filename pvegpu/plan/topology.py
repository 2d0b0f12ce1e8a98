"""Which PCI functions are the node's GPUs, whether each can be passed through, and their stable names.

Pure: `plan_topology(hardware, selector)` reads nothing and changes nothing.

- A GPU is a display function (class 0300, 0302 or 0380) whose vendor:device id the selector lists.
- A card is every function in the GPU's slot (domain:bus:device): the GPU and its HDMI audio etc.
  Proxmox mappings pass the function-less slot address, so all of them go to the VM together.
- A card is `passable` when the IOMMU groups of its functions hold nothing but its own functions and
  bridges (VFIO tolerates PCIe bridges). Any other endpoint, another GPU included, refuses the card and
  is named in the reason. Overriding ACS is never suggested: it fakes the isolation VFIO relies on.
- Names gpu0, gpu1, ... follow a physical key, never group or bus numbers alone, so a BIOS change that
  renumbers buses and groups keeps every name on the same card: `Topology.order_key` says which.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from pvegpu.models.hardware import (
    CLASS_3D,
    CLASS_DISPLAY_OTHER,
    CLASS_VGA,
    Bar,
    HostHardware,
    Link,
    PciFunction,
)
from pvegpu.plan.errors import PlanError

DISPLAY_CLASSES = (CLASS_VGA, CLASS_3D, CLASS_DISPLAY_OTHER)

ORDER_BY_SLOT = "numa node, physical slot"
ORDER_BY_BUS = "numa node, root bus, bus address"

# lspci's names for the classes a GPU's group may hold (pci.ids, class/subclass level).
_CLASS_NAMES = {
    0x0000: "Non-VGA unclassified device",
    0x0100: "SCSI storage controller",
    0x0104: "RAID bus controller",
    0x0106: "SATA controller",
    0x0107: "Serial Attached SCSI controller",
    0x0108: "Non-Volatile memory controller",
    0x0180: "Mass storage controller",
    0x0200: "Ethernet controller",
    0x0207: "Infiniband controller",
    0x0280: "Network controller",
    0x0300: "VGA compatible controller",
    0x0302: "3D controller",
    0x0380: "Display controller",
    0x0401: "Multimedia audio controller",
    0x0403: "Audio device",
    0x0580: "Memory controller",
    0x0600: "Host bridge",
    0x0601: "ISA bridge",
    0x0604: "PCI bridge",
    0x0780: "Communication controller",
    0x0806: "IOMMU",
    0x0880: "System peripheral",
    0x0C03: "USB controller",
    0x0C04: "Fibre Channel",
    0x0C05: "SMBus",
    0x1080: "Encryption controller",
    0x1180: "Signal processing controller",
    0x1200: "Processing accelerators",
    0x1300: "Non-Essential Instrumentation",
}

IOMMU_OFF = (
    "no IOMMU group: the IOMMU is off (enable AMD-Vi/VT-d in firmware and the IOMMU in the kernel cmdline)"
)


class Selection(Protocol):
    """Which display functions are GPUs: `ids` (vendor:device, lowercase) and the `count` expected (None:
    any). The inventory's `GpuSelector` is one; `Selected` is one without pydantic, so that this module and
    the planners built on it stay stdlib-only (the node's pre-start hook runs them, pvegpu/hook)."""

    @property
    def ids(self) -> tuple[str, ...]: ...

    @property
    def count(self) -> int | None: ...


@dataclass(frozen=True)
class Selected:
    """A `Selection` made from what was observed (a vendor's display ids), not declared."""

    ids: tuple[str, ...]
    count: int | None = None


class Verdict(StrEnum):
    PASSABLE = "passable"
    REFUSED = "refused"


@dataclass(frozen=True)
class GpuCard:
    """One selected GPU card.

    `address` is the slot (`0000:41:00`), `functions` every function of that slot (sorted),
    `gpu_function` the display function whose ids, group, link, BARs and NUMA node are reported.
    `reason` is None exactly when the verdict is passable.
    """

    name: str
    address: str
    functions: tuple[str, ...]
    gpu_function: str
    id: str
    subsystem_id: str
    iommu_group: int | None
    root_bus: str
    numa_node: int | None
    link: Link | None
    physical_slot: str | None
    bars: tuple[Bar, ...]
    verdict: Verdict
    reason: str | None


@dataclass(frozen=True)
class Topology:
    """The selected GPUs in physical order (`order_key` names the key), plus topology-level problems
    (expected count not met, nothing selected). `ok` is False when any card is refused or any problem exists.
    """

    gpus: tuple[GpuCard, ...]
    order_key: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems and all(gpu.verdict is Verdict.PASSABLE for gpu in self.gpus)


def plan_topology(hw: HostHardware, selector: Selection) -> Topology:
    """Select, group-check and name the GPUs of `hw` that `selector` describes."""
    gpu_of_slot: dict[str, PciFunction] = {}
    for function in sorted(hw.functions, key=lambda f: _hex_fields(f.address)):
        if function.class_base in DISPLAY_CLASSES and function.id in selector.ids:
            gpu_of_slot.setdefault(function.slot_address, function)
    order_key, sort_key = _ordering(list(gpu_of_slot.values()))
    ordered = sorted(gpu_of_slot.values(), key=sort_key)
    cards = tuple(_card(hw, f"gpu{index}", gpu) for index, gpu in enumerate(ordered))
    return Topology(gpus=cards, order_key=order_key, problems=_problems(selector, len(cards)))


def require_gpus(topology: Topology, selector: Selection) -> None:
    """Raise PlanError naming the field when `selector` matched no display function (`node.gpus.ids`) or
    another number than it declares (`node.gpus.count`); `topology` is `plan_topology(hw, selector)`."""
    if not topology.gpus:
        raise PlanError(f"node.gpus.ids: {', '.join(selector.ids)} matches no display function on this host")
    if topology.problems:
        raise PlanError("node.gpus.count: " + "; ".join(topology.problems))


def plan_vendor_topology(hw: HostHardware, vendor: str, count: int | None = None) -> Topology:
    """`plan_topology` with every display function of `vendor` (e.g. "10de") selected, whatever its model.

    For offline inspection of an unknown box; inventories name their GPU models (`GpuSelector.ids`).
    """
    ids = display_ids(hw, vendor)
    if ids:
        return plan_topology(hw, Selected(ids=ids, count=count))
    if count is not None:
        return Topology(
            gpus=(), order_key=ORDER_BY_BUS, problems=(f"expected {count} GPUs of vendor {vendor}, found 0",)
        )
    return Topology(gpus=(), order_key=ORDER_BY_BUS, problems=(f"no display function of vendor {vendor}",))


def display_ids(hw: HostHardware, vendor: str) -> tuple[str, ...]:
    """The distinct vendor:device ids of `vendor`'s display functions in `hw`, sorted."""
    return tuple(
        sorted({f.id for f in hw.functions if f.vendor == vendor and f.class_base in DISPLAY_CLASSES})
    )


def describe(function: PciFunction) -> str:
    """`0000:43:00.0 (Ethernet controller [0200] 8086:1592)`, as lspci -nn would name it."""
    return f"{function.address} ({class_name(function.class_base)} [{function.class_base:04x}] {function.id})"


def class_name(class_base: int) -> str:
    """lspci's name for a class/subclass; `Class 1234` (lspci's fallback) when not in the table."""
    return _CLASS_NAMES.get(class_base, f"Class {class_base:04x}")


def topology_to_json(topology: Topology) -> dict[str, object]:
    """The public JSON shape of `pvegpu topology --json` (docs/topology-json.md)."""
    return {
        "gpus": [
            {
                "name": gpu.name,
                "address": gpu.address,
                "functions": list(gpu.functions),
                "id": gpu.id,
                "subsystem_id": gpu.subsystem_id,
                "iommu_group": gpu.iommu_group,
                "root_bus": gpu.root_bus,
                "numa_node": gpu.numa_node,
                "verdict": gpu.verdict.value,
                "reason": gpu.reason,
            }
            for gpu in topology.gpus
        ],
        "order_key": topology.order_key,
        "problems": list(topology.problems),
    }


def _card(hw: HostHardware, name: str, gpu: PciFunction) -> GpuCard:
    members = sorted(
        (f for f in hw.functions if f.slot_address == gpu.slot_address), key=lambda f: _hex_fields(f.address)
    )
    verdict, reason = _verdict(hw, members)
    return GpuCard(
        name=name,
        address=gpu.slot_address,
        functions=tuple(f.address for f in members),
        gpu_function=gpu.address,
        id=gpu.id,
        subsystem_id=gpu.subsystem_id,
        iommu_group=gpu.iommu_group,
        root_bus=gpu.root_bus,
        numa_node=gpu.numa_node,
        link=gpu.link,
        physical_slot=gpu.physical_slot,
        bars=gpu.bars,
        verdict=verdict,
        reason=reason,
    )


def _verdict(hw: HostHardware, members: list[PciFunction]) -> tuple[Verdict, str | None]:
    ungrouped = [f.address for f in members if f.iommu_group is None]
    if ungrouped:
        if not hw.iommu_present:
            return Verdict.REFUSED, IOMMU_OFF
        return Verdict.REFUSED, f"no IOMMU group for {', '.join(ungrouped)} although an IOMMU is active"
    own = {f.address for f in members}
    groups = sorted({f.iommu_group for f in members if f.iommu_group is not None})
    clauses = []
    for group in groups:
        offenders = [f for f in hw.group_members(group) if f.address not in own and not f.is_bridge]
        if offenders:
            offenders.sort(key=lambda f: _hex_fields(f.address))
            clauses.append(f"IOMMU group {group} also holds {', '.join(describe(f) for f in offenders)}")
    if not clauses:
        return Verdict.PASSABLE, None
    whole = "the whole group" if len(clauses) == 1 else "the whole groups"
    return Verdict.REFUSED, f"{'; '.join(clauses)}; pass {whole} or move the card"


def _problems(selector: Selection, found: int) -> tuple[str, ...]:
    ids = ", ".join(selector.ids)
    if selector.count is not None and found != selector.count:
        return (f"expected {selector.count} GPUs with id {ids}, found {found}",)
    if found == 0:
        return (f"no display function has id {ids}",)
    return ()


def _ordering(gpus: list[PciFunction]) -> tuple[str, Callable[[PciFunction], tuple[object, ...]]]:
    """Physical slot numbers when every card has a distinct one; else the root complex and bus address.

    Both start with the NUMA node (unknown last). Bus numbers usually keep their relative order when
    firmware renumbers them (enumeration walks the same root complexes and switches in the same order);
    slot numbers do not depend on enumeration at all, hence their precedence.
    """
    slots = [gpu.physical_slot for gpu in gpus]
    if gpus and all(slots) and len(set(slots)) == len(slots):
        return ORDER_BY_SLOT, lambda f: (*_numa_rank(f), _natural(f.physical_slot or ""))
    return ORDER_BY_BUS, lambda f: (*_numa_rank(f), _hex_fields(f.root_bus), _hex_fields(f.address))


def _numa_rank(function: PciFunction) -> tuple[bool, int]:
    return function.numa_node is None, function.numa_node or 0


def _hex_fields(address: str) -> tuple[int, ...]:
    """`0000:41:00.1` -> (0, 0x41, 0, 1); numeric, so a 5-digit domain sorts after 0000."""
    return tuple(int(part, 16) for part in re.split(r"[:.]", address))


def _natural(text: str) -> tuple[tuple[int, int, str], ...]:
    """Slot names compared as humans do: "2" < "10", "SLOT2" < "SLOT10"."""
    parts: Iterable[str] = re.findall(r"\d+|\D+", text)
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)
