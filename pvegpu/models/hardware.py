"""What a host's PCI hardware is, as observed through sysfs. Plain frozen data: no parsing, no I/O."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# PCI class codes (class/subclass, the upper 16 bits of sysfs `class`).
CLASS_VGA = 0x0300
CLASS_3D = 0x0302
CLASS_DISPLAY_OTHER = 0x0380
CLASS_HOST_BRIDGE = 0x0600
CLASS_PCI_BRIDGE = 0x0604


@dataclass(frozen=True)
class Bar:
    """One memory/IO region from sysfs `resource` (index 0-5 = BARs, 6 = expansion ROM)."""

    index: int
    start: int
    size: int
    is_64bit: bool
    prefetchable: bool
    is_io: bool


@dataclass(frozen=True)
class Link:
    """PCIe link state: speed in GT/s (leading float of e.g. "32.0 GT/s PCIe"), width in lanes."""

    current_speed_gts: float | None
    current_width: int | None
    max_speed_gts: float | None
    max_width: int | None


@dataclass(frozen=True)
class PciFunction:
    """One PCI function, e.g. 0000:41:00.0.

    `parents` is the bridge chain from the root bus down to (excluding) this function, e.g.
    ("0000:40:01.1",); `root_bus` is the root complex's bus ("0000:40" for pci0000:40).
    Ids are lowercase 4-hex-digit strings without 0x; `class_code` is the 24-bit class (0x030000).
    `numa_node` is None where sysfs says -1; `iommu_group` is None without an iommu_group link.
    """

    address: str
    vendor: str
    device: str
    subsystem_vendor: str
    subsystem_device: str
    class_code: int
    driver: str | None
    iommu_group: int | None
    numa_node: int | None
    root_bus: str
    parents: tuple[str, ...] = ()
    link: Link | None = None
    bars: tuple[Bar, ...] = ()
    physical_slot: str | None = None

    @property
    def slot_address(self) -> str:
        """The function-less address (domain:bus:device), as Proxmox mappings use it."""
        return self.address.rsplit(".", 1)[0]

    @property
    def class_base(self) -> int:
        """Class and subclass (e.g. 0x0300), without the programming interface byte."""
        return self.class_code >> 8

    @property
    def is_bridge(self) -> bool:
        return self.class_base in (CLASS_PCI_BRIDGE, CLASS_HOST_BRIDGE)

    @property
    def id(self) -> str:
        return f"{self.vendor}:{self.device}"

    @property
    def subsystem_id(self) -> str:
        return f"{self.subsystem_vendor}:{self.subsystem_device}"


@dataclass(frozen=True)
class NumaNode:
    """One host NUMA node and its CPUs (/sys/devices/system/node/nodeN/cpulist), ascending; a node with
    memory only (no CPUs) has none."""

    node: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class HostHardware:
    """Every PCI function of one host, whether an IOMMU is active (/sys/class/iommu non-empty), and the
    host's NUMA nodes by number (none: a kernel without NUMA, or output captured before pvegpu read them)."""

    functions: tuple[PciFunction, ...]
    iommu_present: bool
    numa_nodes: tuple[NumaNode, ...] = ()
    by_address: dict[str, PciFunction] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_address", {f.address: f for f in self.functions})

    def group_members(self, group: int) -> tuple[PciFunction, ...]:
        return tuple(f for f in self.functions if f.iommu_group == group)

    def to_json(self) -> dict[str, object]:
        """JSON-able form; pyinfra's `fact` command prints facts through `to_json`."""
        return {
            "iommu_present": self.iommu_present,
            "functions": [asdict(function) for function in self.functions],
            "numa_nodes": [asdict(node) for node in self.numa_nodes],
        }
