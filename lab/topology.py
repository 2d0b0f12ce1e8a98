"""A declarative language for PCI(e) topologies, and their layout as firmware and the kernel see them.

A `Topology` is a box: root complexes holding devices; a device is a slot on a bus with 1-8 functions; a
bridge function (root port, switch port, PCIe-to-PCI bridge) holds the devices of its secondary bus. Only
what the box is made of is stated; `place()` derives the rest the way the platform does:

- secondary bus numbers depth-first from each root bus, bridges in devfn order (firmware, e.g. SeaBIOS and
  the fixture in shared/fixtures/real-kernel);
- the kernel's scan order, which is its IOMMU probe order: root complexes in the order given (ACPI order),
  on each bus all functions in devfn order, then the buses below each bridge in that order;
- `multifunction`: the kernel sets it on every function of a slot that has more than one (pci_scan_slot).

Grouping lives in `lab.grouping`, the sysfs writer in `lab.fakesys`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from lab.errors import LabError


class Kind(enum.Enum):
    """What the kernel's ACS code distinguishes (pci_pcie_type(), or no PCIe capability at all)."""

    ENDPOINT = "endpoint"  # PCIe endpoint, legacy endpoint or root-complex integrated endpoint
    ROOT_PORT = "root_port"
    UPSTREAM = "upstream"  # switch upstream port
    DOWNSTREAM = "downstream"  # switch downstream port
    PCI_BRIDGE = "pci_bridge"  # PCIe-to-PCI bridge; the functions behind it alias to it for DMA
    CONVENTIONAL = "conventional"  # no PCIe capability (chipset functions, host bridges, devices on PCI)

    @property
    def is_port_or_bridge(self) -> bool:
        return self in (Kind.ROOT_PORT, Kind.UPSTREAM, Kind.DOWNSTREAM, Kind.PCI_BRIDGE)


class Space(enum.Enum):
    MEM32 = "mem32"
    MEM64 = "mem64"
    IO = "io"


@dataclass(frozen=True)
class Bar:
    """A base address register: index 0-5, size in bytes (a power of two)."""

    index: int
    size: int
    space: Space
    prefetchable: bool = False


@dataclass(frozen=True)
class Link:
    """PCIe link as sysfs prints it: speed strings like "32.0 GT/s PCIe", widths in lanes."""

    current_speed: str
    current_width: int
    max_speed: str
    max_width: int


@dataclass(frozen=True)
class Function:
    """One PCI function. `acs`: the function's effective ACS (P2P request redirect, completion redirect,
    upstream forwarding and source validation all on, as the kernel enables them when an IOMMU is used;
    or a kernel quirk saying the same). `iommu_scope=False`: the IOMMU does not translate for it, so it has
    no iommu_group (an AMD root complex's own host bridge and IOMMU functions). `children`: the devices on
    a bridge's secondary bus."""

    fn: int
    vendor: int
    device: int
    class_code: int
    kind: Kind
    subsystem: tuple[int, int] = (0, 0)
    revision: int = 0
    acs: bool = False
    bars: tuple[Bar, ...] = ()
    rom_size: int = 0
    link: Link | None = None
    driver: str | None = None
    iommu_scope: bool = True
    children: tuple[Device, ...] = ()

    @property
    def has_secondary_bus(self) -> bool:
        return self.kind.is_port_or_bridge or bool(self.children)


@dataclass(frozen=True)
class Device:
    """A device (slot) on a bus; `slot` names the physical slot it sits in (bus/pci/slots/<slot>)."""

    dev: int
    functions: tuple[Function, ...]
    slot: str | None = None


@dataclass(frozen=True)
class RootComplex:
    """A PCI host bridge with its root bus (pciDDDD:BB). `numa` None: firmware gives no proximity (-1).
    `qemu_addr`: the slot on bus 00 of the pxb-pcie expander standing in for it in the kernel tier
    (default: the first free one)."""

    bus: int
    numa: int | None
    devices: tuple[Device, ...]
    domain: int = 0
    qemu_addr: int | None = None


@dataclass(frozen=True)
class Topology:
    """A box. `iommu`: which IOMMU the platform has ("amd" | "intel"), None for none (no groups at all).
    `cpulists`: local_cpulist of each NUMA node."""

    name: str
    summary: str
    root_complexes: tuple[RootComplex, ...]
    iommu: str | None = "amd"
    cpulists: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Placed:
    """A function laid out: its address, sysfs path and the bridge chain above it.

    `path` is the sysfs device path relative to /sys ("devices/pci0000:40/0000:40:01.1/0000:41:00.0");
    `key` names the same position without bus numbers ("pci0000:40/01.1/00.0"), so two layouts of one
    shape (a real kernel's and ours) can be compared even where firmware numbered buses differently.
    """

    address: str
    function: Function
    numa: int | None
    root_bus: str
    parents: tuple[str, ...]
    path: str
    key: str
    multifunction: bool
    secondary_bus: int | None
    slot: str | None

    @property
    def slot_address(self) -> str:
        return self.address.rsplit(".", 1)[0]

    @property
    def parent(self) -> str | None:
        return self.parents[-1] if self.parents else None


class TopologyError(LabError, ValueError):
    """A description no firmware could lay out (a device twice, function 0 missing, bus numbers exhausted
    or shared by two root complexes)."""


def address(domain: int, bus: int, dev: int, fn: int) -> str:
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def place(topology: Topology) -> tuple[Placed, ...]:
    """Every function of `topology`, laid out, in the kernel's scan (= IOMMU probe) order.
    Raises TopologyError for a slot without function 0, or bus numbers that overflow or overlap."""
    placed: list[Placed] = []
    owner: dict[tuple[int, int], int] = {}  # (domain, bus) -> root bus that numbered it
    for rc in topology.root_complexes:
        root_bus = f"{rc.domain:04x}:{rc.bus:02x}"
        layout = _Layout(rc, placed)
        layout.bus(rc.bus, rc.devices, parents=(), path=f"devices/pci{root_bus}", key=f"pci{root_bus}")
        for bus in range(rc.bus, layout.last_bus + 1):
            if (rc.domain, bus) in owner:
                raise TopologyError(
                    f"{topology.name}: bus {rc.domain:04x}:{bus:02x} is below root buses "
                    f"{owner[rc.domain, bus]:02x} and {rc.bus:02x}"
                )
            owner[rc.domain, bus] = rc.bus
    return tuple(placed)


class _Layout:
    """Numbers the buses of one root complex and appends its functions in scan order."""

    def __init__(self, rc: RootComplex, out: list[Placed]) -> None:
        self.rc = rc
        self.out = out
        self.last_bus = rc.bus

    def bus(
        self, number: int, devices: tuple[Device, ...], parents: tuple[str, ...], path: str, key: str
    ) -> None:
        here: list[Placed] = []
        devs = sorted(d.dev for d in devices)
        for twice in {d for d in devs if devs.count(d) > 1}:
            raise TopologyError(
                f"bus {self.rc.domain:04x}:{number:02x}: device {twice:02x} is described twice"
            )
        for device in sorted(devices, key=lambda d: d.dev):
            functions = sorted(device.functions, key=lambda f: f.fn)
            fns = [f.fn for f in functions]
            if not functions or fns[0] != 0 or len(set(fns)) != len(fns):
                raise TopologyError(
                    f"bus {self.rc.domain:04x}:{number:02x} device {device.dev:02x}: functions {fns} "
                    "(function 0 is required, each function once)"
                )
            for function in functions:
                addr = address(self.rc.domain, number, device.dev, function.fn)
                here.append(
                    Placed(
                        address=addr,
                        function=function,
                        numa=self.rc.numa,
                        root_bus=f"{self.rc.domain:04x}:{self.rc.bus:02x}",
                        parents=parents,
                        path=f"{path}/{addr}",
                        key=f"{key}/{device.dev:02x}.{function.fn:x}",
                        multifunction=len(functions) > 1,
                        secondary_bus=None,
                        slot=device.slot,
                    )
                )
        # Scan order: every function of this bus first (the kernel adds them as it scans the bus) ...
        start = len(self.out)
        self.out.extend(here)
        # ... then the buses below each bridge, depth-first, which is also firmware's numbering order: a
        # bridge's secondary bus is the next free number once the bridges before it took theirs.
        for offset, placed in enumerate(here):
            if not placed.function.has_secondary_bus:
                continue
            if self.last_bus == 0xFF:
                raise TopologyError(f"{placed.address}: no bus number left for its secondary bus")
            self.last_bus += 1
            self.out[start + offset] = replace(placed, secondary_bus=self.last_bus)
            self.bus(
                self.last_bus,
                placed.function.children,
                parents=(*placed.parents, placed.address),
                path=placed.path,
                key=placed.key,
            )
