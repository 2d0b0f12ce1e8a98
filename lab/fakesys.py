"""Fake sysfs PCI/IOMMU trees for the lab, generated from a topology description (`lab.topologies`).

`write_tree(out, topology)` writes into `out` (which plays /sys) the part of sysfs pvegpu and lspci read:

    devices/pciDDDD:BB/<bridge chain>/<bdf>/   vendor device subsystem_vendor subsystem_device class revision
                                               numa_node local_cpulist irq enable resource config modalias
                                               uevent driver_override; current/max_link_speed and _width
                                               (PCIe functions); reset + reset_method (endpoints); boot_vga
                                               (VGA); pci_bus/<bus>/ + secondary/subordinate_bus_number
                                               (bridges); links iommu_group -> ../(..)/kernel/iommu_groups/N,
                                               driver -> ../(..)/bus/pci/drivers/<name>
    bus/pci/devices/<bdf>                      -> ../../../devices/pci.../<bdf>
    bus/pci/drivers/<name>/<bdf>               -> the device; bind unbind new_id remove_id
    bus/pci/slots/<name>/address               function-less address, e.g. 0000:41:00
    kernel/iommu_groups/N/devices/<bdf>        -> the device; type reserved_regions
    class/iommu/<ivhdN|dmar0>                  -> the IOMMU's device (empty directory without an IOMMU)
    devices/system/node/nodeN/cpulist          each NUMA node's CPUs (the topology's `cpulists`), e.g.
                                               `0-31,64-95`; no node directory for a topology without them

Every link is relative, like the kernel's, so the tree works wherever it is put. Formats follow
drivers/pci/pci-sysfs.c (shared/knowledge/linux-sysfs-lspci-nvidia-nccl-formats.md): ids `0x%04x`, class
`0x%06x`, `resource` as `0x%016llx 0x%016llx 0x%016llx` lines, 13 for endpoints and 17 for bridges (BARs,
ROM, SR-IOV BARs, then the bridge windows), flags as the kernel derives them from the BARs.
The groups are computed (`lab.grouping`), never written down by hand.

    python -m lab.fakesys OUT --topology NAME [--driver nvidia|vfio-pci|none] [--json FILE]
    python -m lab.fakesys --list
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.grouping import iommu_groups
from lab.topologies import NVIDIA, TOPOLOGIES
from lab.topology import Function, Kind, Placed, Space, Topology, place

__all__ = ["DRIVERS", "TOPOLOGIES", "Manifest", "manifest", "write_tree"]

DRIVERS = ("nvidia", "vfio-pci", "none")
Manifest = dict[str, Any]

# include/linux/ioport.h
IORESOURCE_IO = 0x100
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_READONLY = 0x4000
IORESOURCE_SIZEALIGN = 0x40000
IORESOURCE_MEM_64 = 0x00100000
ENDPOINT_RESOURCE_LINES = 13  # 6 BARs, ROM, 6 SR-IOV BARs (CONFIG_PCI_IOV, as in Debian/Proxmox kernels)
BRIDGE_RESOURCE_LINES = 17  # + 4 bridge windows: io, mem, prefetchable mem, unused
ROM_LINE = 6

# Where the allocator starts handing out addresses; bridge windows have 1 MiB (mem) and 4 KiB (io) granules.
MEM32_BASE, MEM64_BASE, IO_BASE = 0x8000_0000, 0x100_0000_0000, 0x1000
MEM_GRANULE, IO_GRANULE = 1 << 20, 1 << 12

AMD_RESERVED_REGIONS = (
    "0x00000000fee00000 0x00000000feefffff msi\n0x000000fd00000000 0x000000ffffffffff reserved\n"
)
INTEL_RESERVED_REGIONS = "0x00000000fee00000 0x00000000feefffff msi\n"


def _topology(topology: str | Topology) -> Topology:
    if isinstance(topology, Topology):
        return topology
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; known: {', '.join(sorted(TOPOLOGIES))}")
    return TOPOLOGIES[topology]


def _bound_driver(placed: Placed, card_slots: set[str], driver: str) -> str | None:
    """The driver bound to a function: the description's, except on NVIDIA cards where `driver` decides
    (nvidia: GPU on nvidia, audio on snd_hda_intel; vfio-pci: every function; none: unbound)."""
    if placed.slot_address not in card_slots:
        return placed.function.driver
    if driver == "none":
        return None
    if driver == "vfio-pci":
        return "vfio-pci"
    return placed.function.driver


def _is_nvidia_display(function: Function) -> bool:
    return function.vendor == NVIDIA and function.class_code >> 16 == 0x03


@dataclass
class _Layout:
    """Everything computed before writing: layout, groups, drivers, resources."""

    topology: Topology
    functions: tuple[Placed, ...]
    groups: dict[str, int]
    drivers: dict[str, str | None]
    resources: dict[str, list[tuple[int, int, int]]]
    subordinate: dict[str, int]
    gpu_slots: list[str]


def _layout(topology: Topology, driver: str) -> _Layout:
    if driver not in DRIVERS:
        raise ValueError(f"unknown driver {driver!r}; known: {', '.join(DRIVERS)}")
    functions = place(topology)
    groups = iommu_groups(functions) if topology.iommu else {}
    gpu_slots = [f.slot_address for f in functions if _is_nvidia_display(f.function) and f.function.fn == 0]
    card_slots = set(gpu_slots)
    drivers = {f.address: _bound_driver(f, card_slots, driver) for f in functions}
    resources, subordinate = _Resources(functions).assign()
    return _Layout(topology, functions, groups, drivers, resources, subordinate, gpu_slots)


class _Resources:
    """Gives every BAR an address (naturally aligned, one granule at least, so bridge windows never
    overlap) walking the tree depth-first, then sizes each bridge's windows to what lies below it.
    64-bit prefetchable BARs go above 4 GiB; everything else memory-mapped below (bridges' non-prefetchable
    window is 32-bit), like Linux/firmware allocation."""

    def __init__(self, functions: Sequence[Placed]) -> None:
        self.functions = functions
        self.children: dict[str | None, list[Placed]] = {}
        for f in functions:
            self.children.setdefault(f.parent, []).append(f)
        self.cursor = {"mem32": MEM32_BASE, "mem64": MEM64_BASE, "io": IO_BASE}
        self.ranges: dict[str, dict[str, tuple[int, int]]] = {}  # address -> pool -> (start, end)
        self.lines: dict[str, list[tuple[int, int, int]]] = {}
        self.subordinate: dict[str, int] = {}

    def _take(self, pool: str, size: int) -> int:
        align = max(size, IO_GRANULE if pool == "io" else MEM_GRANULE)
        start = -(-self.cursor[pool] // align) * align
        self.cursor[pool] = start + size
        return start

    def _visit(self, f: Placed) -> tuple[dict[str, tuple[int, int]], int]:
        """Allocate `f` and everything below it; returns the address ranges used per pool, max bus below."""
        used: dict[str, tuple[int, int]] = {}

        def note(pool: str, start: int, size: int) -> None:
            lo, hi = used.get(pool, (start, start + size - 1))
            used[pool] = (min(lo, start), max(hi, start + size - 1))

        bridge = f.secondary_bus is not None
        lines = [(0, 0, 0)] * (BRIDGE_RESOURCE_LINES if bridge else ENDPOINT_RESOURCE_LINES)
        for bar in f.function.bars:
            if bar.space is Space.IO:
                pool, flags = "io", 0x1 | IORESOURCE_IO | IORESOURCE_SIZEALIGN
            else:
                is64 = bar.space is Space.MEM64
                pool = "mem64" if is64 and bar.prefetchable else "mem32"
                # The BAR register's low bits (type, prefetchable) are kept in the flags (pci_parse_bar).
                flags = (
                    (0x4 if is64 else 0)
                    | (0x8 if bar.prefetchable else 0)
                    | IORESOURCE_MEM
                    | IORESOURCE_SIZEALIGN
                )
                flags |= (IORESOURCE_MEM_64 if is64 else 0) | (IORESOURCE_PREFETCH if bar.prefetchable else 0)
            start = self._take(pool, bar.size)
            note(pool, start, bar.size)
            lines[bar.index] = (start, start + bar.size - 1, flags)
        if f.function.rom_size:
            start = self._take("mem32", f.function.rom_size)
            note("mem32", start, f.function.rom_size)
            rom_flags = IORESOURCE_MEM | IORESOURCE_PREFETCH | IORESOURCE_READONLY | IORESOURCE_SIZEALIGN
            lines[ROM_LINE] = (start, start + f.function.rom_size - 1, rom_flags)
        max_bus = f.secondary_bus or 0
        for child in self.children.get(f.address, []):
            below, child_bus = self._visit(child)
            max_bus = max(max_bus, child_bus)
            for pool, (lo, hi) in below.items():
                note(pool, lo, hi - lo + 1)
        if bridge:
            self.subordinate[f.address] = max_bus
            windows = (
                ("io", IO_GRANULE, 0x101),
                ("mem32", MEM_GRANULE, 0x200),
                ("mem64", MEM_GRANULE, 0x102201),
            )
            for offset, (pool, granule, flags) in enumerate(windows):
                if pool in used:
                    lo, hi = used[pool]
                    lines[ENDPOINT_RESOURCE_LINES + offset] = (
                        lo,
                        -(-(hi + 1) // granule) * granule - 1,
                        flags,
                    )
        self.lines[f.address] = lines
        return used, max_bus

    def assign(self) -> tuple[dict[str, list[tuple[int, int, int]]], dict[str, int]]:
        for root in self.children.get(None, []):
            self._visit(root)
        return self.lines, self.subordinate


class _Writer:
    """Writes files and relative links under the tree root; keeps the set of directories made."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.made: set[str] = set()

    def dir(self, rel: str) -> str:
        path = os.path.join(self.root, rel)
        if rel not in self.made:
            os.makedirs(path, exist_ok=True)
            self.made.add(rel)
        return path

    def file(self, rel_dir: str, name: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        fd = os.open(os.path.join(self.dir(rel_dir), name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def link(self, rel_dir: str, name: str, target_rel: str) -> None:
        """`rel_dir/name` -> `target_rel` (both relative to the root), as a relative symlink."""
        os.symlink(os.path.relpath(target_rel, rel_dir), os.path.join(self.dir(rel_dir), name))


def _modalias(f: Function, subsystem: tuple[int, int]) -> str:
    c = f.class_code
    return (
        f"pci:v{f.vendor:08X}d{f.device:08X}sv{subsystem[0]:08X}sd{subsystem[1]:08X}"
        f"bc{c >> 16:02X}sc{(c >> 8) & 0xFF:02X}i{c & 0xFF:02X}"
    )


def _config(p: Placed, enabled: bool, subordinate: int, resource: list[tuple[int, int, int]]) -> bytes:
    """The first 64 bytes of config space (what an unprivileged read returns), consistent with `resource`:
    ids, command (I/O and memory decoding, bus master), class, header type (multifunction bit, bridge
    layout), then BARs and subsystem ids (endpoints) or bus numbers and windows (bridges). The expansion
    ROM is left disabled, as on most cards until a driver reads it."""
    f = p.function
    cfg = bytearray(64)

    def put(offset: int, value: int, size: int) -> None:
        cfg[offset : offset + size] = value.to_bytes(size, "little")

    put(0, f.vendor, 2)
    put(2, f.device, 2)
    has_io = any(flags & IORESOURCE_IO for _, _, flags in resource)
    put(4, ((0x1 if has_io else 0) | 0x2 | 0x4) if enabled else 0, 2)
    cfg[8] = f.revision
    put(9, f.class_code, 3)
    bridge = p.secondary_bus is not None
    cfg[14] = (0x01 if bridge else 0x00) | (0x80 if p.multifunction else 0)
    for bar in f.bars:
        start, _, flags = resource[bar.index]
        put(0x10 + 4 * bar.index, (start & 0xFFFFFFFF) | (flags & 0xF), 4)
        if flags & IORESOURCE_MEM_64:
            put(0x14 + 4 * bar.index, start >> 32, 4)
    if bridge:
        put(0x18, int(p.address.split(":")[1], 16) | (p.secondary_bus or 0) << 8 | subordinate << 16, 3)
        io, mem, pref = resource[ENDPOINT_RESOURCE_LINES : ENDPOINT_RESOURCE_LINES + 3]
        if io[2]:
            put(0x1C, (io[0] >> 8) & 0xF0 | ((io[1] >> 8) & 0xF0) << 8, 2)
        if mem[2]:
            put(0x20, (mem[0] >> 16) & 0xFFF0 | ((mem[1] >> 16) & 0xFFF0) << 16, 4)
        if pref[2]:
            put(0x24, (pref[0] >> 16) & 0xFFF0 | 0x1 | (((pref[1] >> 16) & 0xFFF0) | 0x1) << 16, 4)
            put(0x28, pref[0] >> 32, 4)
            put(0x2C, pref[1] >> 32, 4)
    else:
        put(0x2C, f.subsystem[0], 2)
        put(0x2E, f.subsystem[1], 2)
        if f.rom_size:
            put(0x30, resource[ROM_LINE][0], 4)
    return bytes(cfg)


def _write_bus(w: _Writer, layout: _Layout) -> None:
    """The directories and files that are not a device's: bus/pci, drivers, iommu_groups, root buses."""
    for name in ("devices", "slots"):
        w.dir(f"bus/pci/{name}")
    w.dir("class/iommu")
    for name in ("drivers_probe", "rescan"):
        w.file("bus/pci", name, "")
    w.file("bus/pci", "drivers_autoprobe", "1\n")
    regions = AMD_RESERVED_REGIONS if layout.topology.iommu == "amd" else INTEL_RESERVED_REGIONS
    for group in sorted(set(layout.groups.values())):
        gdir = f"kernel/iommu_groups/{group}"
        w.dir(f"{gdir}/devices")
        w.file(gdir, "type", "DMA-FQ\n")
        w.file(gdir, "reserved_regions", regions)
    for rc_bus in sorted({f.root_bus for f in layout.functions}):
        w.dir(f"devices/pci{rc_bus}/pci_bus/{rc_bus}")
    for driver in sorted({d for d in layout.drivers.values() if d}):
        for name in ("bind", "unbind", "new_id", "remove_id"):
            w.file(f"bus/pci/drivers/{driver}", name, "")
    if layout.topology.iommu == "intel":
        w.dir("devices/virtual/iommu/dmar0")
        w.link("class/iommu", "dmar0", "devices/virtual/iommu/dmar0")
    slots: dict[str, str] = {}
    for p in layout.functions:
        if p.slot is not None:
            slots.setdefault(p.slot, p.slot_address)
    for name, slot_address in slots.items():
        w.file(f"bus/pci/slots/{name}", "address", slot_address + "\n")


def _write_function(w: _Writer, layout: _Layout, p: Placed, irq: int, cpulist: str) -> None:
    f, d, sub = p.function, p.path, p.function.subsystem
    driver = layout.drivers[p.address]
    modalias = _modalias(f, sub)
    attributes = {
        "vendor": f"0x{f.vendor:04x}",
        "device": f"0x{f.device:04x}",
        "subsystem_vendor": f"0x{sub[0]:04x}",
        "subsystem_device": f"0x{sub[1]:04x}",
        "class": f"0x{f.class_code:06x}",
        "revision": f"0x{f.revision:02x}",
        "numa_node": str(-1 if p.numa is None else p.numa),
        "local_cpulist": cpulist,
        "irq": str(irq if driver else 0),
        "enable": "1" if driver else "0",
        "driver_override": "(null)",
        "modalias": modalias,
    }
    if f.link is not None:
        attributes["current_link_speed"] = f.link.current_speed
        attributes["current_link_width"] = str(f.link.current_width)
        attributes["max_link_speed"] = f.link.max_speed
        attributes["max_link_width"] = str(f.link.max_width)
    if f.kind is Kind.ENDPOINT and f.iommu_scope:
        attributes["reset_method"] = "flr bus"
    if f.class_code >> 8 == 0x0300:
        attributes["boot_vga"] = "0" if _is_nvidia_display(f) else "1"
    if p.secondary_bus is not None:
        attributes["secondary_bus_number"] = str(p.secondary_bus)
        attributes["subordinate_bus_number"] = str(layout.subordinate[p.address])
        domain = p.root_bus.split(":")[0]
        w.file(f"{d}/pci_bus/{domain}:{p.secondary_bus:02x}", "cpulistaffinity", cpulist + "\n")
    for name, value in attributes.items():
        w.file(d, name, value + "\n")
    if "reset_method" in attributes:
        w.file(d, "reset", "")
    uevent = [
        *([f"DRIVER={driver}"] if driver else []),
        f"PCI_CLASS={f.class_code:X}",
        f"PCI_ID={f.vendor:04X}:{f.device:04X}",
        f"PCI_SUBSYS_ID={sub[0]:04X}:{sub[1]:04X}",
        f"PCI_SLOT_NAME={p.address}",
        f"MODALIAS={modalias}",
    ]
    w.file(d, "uevent", "\n".join(uevent) + "\n")
    resource = layout.resources[p.address]
    w.file(d, "config", _config(p, bool(driver), layout.subordinate.get(p.address, 0), resource))
    w.file(d, "resource", "".join(f"0x{a:016x} 0x{b:016x} 0x{c:016x}\n" for a, b, c in resource))
    w.link("bus/pci/devices", p.address, d)
    if p.address in layout.groups:
        gdir = f"kernel/iommu_groups/{layout.groups[p.address]}"
        w.link(d, "iommu_group", gdir)
        w.link(f"{gdir}/devices", p.address, d)
    if driver:
        w.link(d, "driver", f"bus/pci/drivers/{driver}")
        w.link(f"bus/pci/drivers/{driver}", p.address, d)


def _write(layout: _Layout, out: Path) -> None:
    w = _Writer(out)
    topology = layout.topology
    all_cpus = ",".join(topology.cpulists[n] for n in sorted(topology.cpulists)) or "0"
    _write_bus(w, layout)
    for node, cpulist in sorted(topology.cpulists.items()):
        w.file(f"devices/system/node/node{node}", "cpulist", cpulist + "\n")
    irq = 32
    for p in layout.functions:
        cpulist = all_cpus if p.numa is None else topology.cpulists.get(p.numa, all_cpus)
        _write_function(w, layout, p, irq, cpulist)
        irq += 1 if layout.drivers[p.address] else 0
    # AMD: one IOMMU per root complex, each a PCI function (00.2), ivhd0, ivhd1, ... in probe order.
    amd_iommus = (
        [p for p in layout.functions if p.function.class_code == 0x080600] if topology.iommu == "amd" else []
    )
    for index, p in enumerate(amd_iommus):
        w.dir(f"{p.path}/iommu/ivhd{index}")
        w.link("class/iommu", f"ivhd{index}", f"{p.path}/iommu/ivhd{index}")


def _physical_order(p: Placed) -> tuple[int, int, str]:
    numa = -1 if p.numa is None else p.numa
    slot = int(p.slot) if p.slot is not None and p.slot.isdigit() else 1 << 16
    return numa, slot, p.address


def _manifest(layout: _Layout, driver: str) -> Manifest:
    by_address = {p.address: p for p in layout.functions}
    groups: dict[int, list[str]] = {}
    for address, group in layout.groups.items():
        groups.setdefault(group, []).append(address)
    devices = {
        p.address: {
            "vendor": f"{p.function.vendor:04x}",
            "device": f"{p.function.device:04x}",
            "subsystem_vendor": f"{p.function.subsystem[0]:04x}",
            "subsystem_device": f"{p.function.subsystem[1]:04x}",
            "class": f"0x{p.function.class_code:06x}",
            "driver": layout.drivers[p.address],
            "iommu_group": layout.groups.get(p.address),
            "numa_node": p.numa,
            "root_bus": p.root_bus,
            "parents": list(p.parents),
            "path": p.path,
            "physical_slot": p.slot,
        }
        for p in layout.functions
    }
    cards = sorted((by_address[f"{slot}.0"] for slot in layout.gpu_slots), key=_physical_order)
    gpus = [
        {
            "index": index,
            "address": gpu.slot_address,
            "functions": sorted(a for a, p in by_address.items() if p.slot_address == gpu.slot_address),
            "iommu_group": layout.groups.get(gpu.address),
            "numa_node": gpu.numa,
            "root_bus": gpu.root_bus,
            "physical_slot": gpu.slot,
        }
        for index, gpu in enumerate(cards)
    ]
    return {
        "topology": layout.topology.name,
        "summary": layout.topology.summary,
        "driver": driver,
        "iommu": layout.topology.iommu,
        "groups": {str(g): sorted(members) for g, members in sorted(groups.items())},
        "devices": devices,
        "gpus": gpus,
    }


def manifest(topology: str | Topology, driver: str = "nvidia") -> Manifest:
    """What `write_tree` would return, without writing anything."""
    return _manifest(_layout(_topology(topology), driver), driver)


def write_tree(out: Path, topology: str | Topology, driver: str = "nvidia") -> Manifest:
    """Write the fake sysfs of `topology` (a name in TOPOLOGIES, or a description) into `out`, which must be
    empty or absent; `driver` binds the NVIDIA cards' functions (nvidia | vfio-pci | none).

    Returns the JSON-able manifest: `groups` (number -> member addresses), `devices` (address -> ids,
    class, driver, group, NUMA node, root bus, bridge chain, sysfs path, physical slot) and `gpus`, the
    NVIDIA cards in physical order (NUMA node, then physical slot), each with its function-less address.
    Raises ValueError for an unknown topology or driver, or a non-empty `out`.
    """
    layout = _layout(_topology(topology), driver)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise ValueError(f"{out} is not empty: refusing to write a sysfs tree over it")
    _write(layout, out)
    return _manifest(layout, driver)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.fakesys", description="write a fake sysfs PCI/IOMMU tree"
    )
    parser.add_argument("out", nargs="?", type=Path, help="directory that plays /sys (empty or absent)")
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES), help="which box")
    parser.add_argument(
        "--driver", choices=DRIVERS, default="nvidia", help="driver of the NVIDIA cards' functions"
    )
    parser.add_argument("--json", type=Path, help="write the manifest here (default: stdout)")
    parser.add_argument("--list", action="store_true", help="list the topologies and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name in sorted(TOPOLOGIES):
            print(f"{name}\t{TOPOLOGIES[name].summary}")
        return 0
    if args.out is None or args.topology is None:
        parser.error("OUT and --topology are required (or --list)")
    try:
        result = write_tree(args.out, args.topology, args.driver)
    except ValueError as error:
        print(f"python -m lab.fakesys: {error}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if args.json:
        args.json.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
