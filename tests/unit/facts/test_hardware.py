"""The PCI hardware fact: one command over sysfs, parsed by pure functions.

Evidence used:
- shared/fixtures/real/19: raw attribute bytes of a real kernel (6.18) -> the per-attribute parsers.
- tests/unit/fixtures/pci_hardware_*.txt: this command's own output on real kernels (source line inside):
  a Firecracker VM (virtio, no IOMMU) and Debian's 6.1 kernel under QEMU q35 with an IOMMU, a switch, a
  second root complex on NUMA node 1 and hotplug slots -> parse_hardware, exactly.
- the live /sys of the machine running the tests (a real kernel, whatever it is).
- small kernel-like trees written below (synthesized, labelled as such) for what those cannot show:
  GPU-sized 64-bit BARs, SR-IOV and bridge-window lines, old-kernel link formats, ambiguous slots.
- the lab's generated reference box (lab.fakesys), read back against its manifest and description.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import stat
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import astuple, dataclass, replace
from pathlib import Path

import pytest
from pyinfra.api.facts import get_fact

from lab import fakesys
from lab.topologies import TOPOLOGIES
from lab.topology import place
from pvegpu.facts.errors import FactCommandError, FactParseError
from pvegpu.facts.hardware import (
    PciHardware,
    hardware_command,
    parse_class,
    parse_hardware,
    parse_id,
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    parse_resource_line,
    read_hardware_locally,
)
from pvegpu.models.hardware import Bar, HostHardware, Link, NumaNode, PciFunction
from tests.unit import realdata
from tests.unit.pyinfra_local import local_state

FIXTURES = Path(__file__).parents[1] / "fixtures"


def capture_lines() -> list[str]:
    """The real capture without its first (source) line."""
    return (FIXTURES / "pci_hardware_virtio_vm.txt").read_text().splitlines()[1:]


# --- per-attribute parsers on the real bytes of shared/fixtures/real/19 -------------------------------------

FIXTURE_19_EXPECTED = {
    "0000:00:00.0": ("8086", "0d57", "0000", "0000", 0x060000),
    "0000:00:01.0": ("1af4", "1045", "1af4", "1045", 0xFFFF00),
    "0000:00:02.0": ("1af4", "1042", "1af4", "1042", 0x018000),
    "0000:00:03.0": ("1af4", "1041", "1af4", "1041", 0x020000),
    "0000:00:04.0": ("1af4", "1053", "1af4", "1053", 0xFFFF00),
    "0000:00:05.0": ("1af4", "1044", "1af4", "1044", 0xFFFF00),
}


def fixture_19_attributes() -> dict[str, dict[str, str]]:
    """address -> attribute -> value, from the `attr: bytes$` lines ($ marks the kernel's newline)."""
    devices: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    path = realdata.real_fixture("19_sysfs_pci_attribute_bytes_helper_sandbox_vm.txt")
    for line in path.read_text().splitlines():
        if line.startswith("== /sys/bus/pci/devices/"):
            current = devices.setdefault(line.split()[1].rsplit("/", 1)[1], {})
        elif line.endswith("$") and ": " in line:
            name, value = line[:-1].split(": ", 1)
            current[name] = value
    return devices


def test_fixture_19_attribute_bytes_parse_to_exact_values() -> None:
    devices = fixture_19_attributes()
    assert sorted(devices) == sorted(FIXTURE_19_EXPECTED)
    for address, (vendor, device, svendor, sdevice, class_code) in FIXTURE_19_EXPECTED.items():
        attrs = devices[address]
        assert parse_id(attrs["vendor"]) == vendor
        assert parse_id(attrs["device"]) == device
        assert parse_id(attrs["subsystem_vendor"]) == svendor
        assert parse_id(attrs["subsystem_device"]) == sdevice
        assert parse_class(attrs["class"]) == class_code
        assert parse_numa_node(attrs["numa_node"]) is None  # "-1": a VM without NUMA information


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32.0 GT/s PCIe", 32.0),
        ("2.5 GT/s PCIe", 2.5),
        ("64.0 GT/s PCIe", 64.0),
        ("8 GT/s", 8.0),  # kernels before PCIE_SPEED2STR gained "PCIe"
        ("Unknown", None),
        ("Unknown speed", None),
    ],
)
def test_parse_link_speed(text: str, expected: float | None) -> None:
    assert parse_link_speed(text) == expected


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_id, "0x10DE", "expected 0x%04x, got '0x10DE'"),
        (parse_id, "0x10de0", "expected 0x%04x, got '0x10de0'"),
        (parse_class, "0x0300", "expected 0x%06x, got '0x0300'"),
        (parse_numa_node, "-2", "expected a node number or -1, got '-2'"),
        (parse_numa_node, "", "expected a node number or -1, got ''"),
        (parse_link_speed, "32 GT/s x16", "expected '<float> GT/s[ PCIe]' or 'Unknown', got '32 GT/s x16'"),
        (parse_link_width, "x16", "expected a lane count, got 'x16'"),
    ],
)
def test_attribute_parsers_refuse_other_formats(
    parse: Callable[[str], object], text: str, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        parse(text)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # Real: the virtio BAR of the capture (MEM | MEM_64 | SIZEALIGN, 64-bit non-prefetchable).
        (
            "0x0000004000000000 0x000000400007ffff 0x0000000000140204",
            Bar(index=0, start=0x4000000000, size=0x80000, is_64bit=True, prefetchable=False, is_io=False),
        ),
        # GPU BAR1: 64-bit prefetchable, 128 GiB.
        (
            "0x0000018000000000 0x0000019fffffffff 0x000000000014220c",
            Bar(index=0, start=0x18000000000, size=128 << 30, is_64bit=True, prefetchable=True, is_io=False),
        ),
        # I/O BAR of 128 ports.
        (
            "0x000000000000f000 0x000000000000f07f 0x0000000000040101",
            Bar(index=0, start=0xF000, size=128, is_64bit=False, prefetchable=False, is_io=True),
        ),
        ("0x0000000000000000 0x0000000000000000 0x0000000000000000", None),
    ],
)
def test_parse_resource_line(line: str, expected: Bar | None) -> None:
    assert parse_resource_line(0, line) == expected


def test_parse_resource_line_refuses_end_below_start() -> None:
    with pytest.raises(ValueError, match=r"^line 3: end 0xf is below start 0x10$"):
        parse_resource_line(3, "0x0000000000000010 0x000000000000000f 0x0000000000000200")


# --- the real capture -------------------------------------------------------------------------------------


def virtio(address: str, device: str, class_code: int, bar_start: int) -> PciFunction:
    return PciFunction(
        address=address,
        vendor="1af4",
        device=device,
        subsystem_vendor="1af4",
        subsystem_device=device,
        class_code=class_code,
        driver="virtio-pci",
        iommu_group=None,
        numa_node=None,
        root_bus="0000:00",
        bars=(Bar(index=0, start=bar_start, size=0x80000, is_64bit=True, prefetchable=False, is_io=False),),
    )


VIRTIO_VM = HostHardware(
    functions=(
        PciFunction(
            address="0000:00:00.0",
            vendor="8086",
            device="0d57",
            subsystem_vendor="0000",
            subsystem_device="0000",
            class_code=0x060000,
            driver=None,
            iommu_group=None,
            numa_node=None,
            root_bus="0000:00",
        ),
        virtio("0000:00:01.0", "1045", 0xFFFF00, 0x4000000000),
        virtio("0000:00:02.0", "1042", 0x018000, 0x4000080000),
        virtio("0000:00:03.0", "1041", 0x020000, 0x4000100000),
        virtio("0000:00:04.0", "1053", 0xFFFF00, 0x4000180000),
        virtio("0000:00:05.0", "1044", 0xFFFF00, 0x4000200000),
    ),
    iommu_present=False,
    numa_nodes=(NumaNode(0, (0, 1)),),
)


def test_real_capture_parses_exactly() -> None:
    assert parse_hardware(capture_lines()) == VIRTIO_VM


# The QEMU capture (source line in the fixture): a real 6.1 kernel with an IOMMU, bridges, a switch, a second
# root complex on NUMA node 1 and hotplug slots. Per function: ids, class, group, driver, NUMA node, root bus,
# bridge chain, link (current speed, width, max speed, width), BARs (index, size, kind), physical slot.
SW = ("0000:00:03.0", "0000:02:00.0", "0000:03:00.0")  # root port, switch upstream, switch downstream
RP = "0000:00:02.0"
QEMU_EXPECTED = [
    ("0000:00:00.0", "8086:29c0", 0x060000, 0, None, None, "0000:00", (), None, (), None),
    ("0000:00:02.0", "1b36:000c", 0x060400, 1, "pcieport", None, "0000:00", (), (2.5, 1, 16.0, 16),
     ((0, 4096, "32"),), None),
    ("0000:00:03.0", "1b36:000c", 0x060400, 2, "pcieport", None, "0000:00", (), (2.5, 1, 16.0, 32),
     ((0, 4096, "32"),), None),
    ("0000:00:06.0", "1b36:000b", 0x060000, 3, None, None, "0000:00", (), None, (), None),
    ("0000:00:1f.0", "8086:2918", 0x060100, 4, None, None, "0000:00", (), None, (), None),
    ("0000:00:1f.2", "8086:2922", 0x010601, 4, None, None, "0000:00", (), None,
     ((4, 32, "io"), (5, 4096, "32")), None),
    ("0000:00:1f.3", "8086:2930", 0x0C0500, 4, None, None, "0000:00", (), None, ((4, 64, "io"),), None),
    ("0000:01:00.0", "1234:1111", 0x038000, 5, None, None, "0000:00", (RP,), (2.5, 1, 2.5, 1),
     ((0, 16 << 20, "32p"), (2, 4096, "32")), "0"),
    ("0000:01:00.1", "8086:293e", 0x040300, 5, None, None, "0000:00", (RP,), None, ((0, 16384, "32"),), "0"),
    ("0000:02:00.0", "104c:8232", 0x060400, 6, "pcieport", None, "0000:00", SW[:1], (2.5, 1, 2.5, 1), (),
     None),
    ("0000:03:00.0", "104c:8233", 0x060400, 7, "pcieport", None, "0000:00", SW[:2], (2.5, 1, None, 0), (),
     None),
    ("0000:04:00.0", "8086:10d3", 0x020000, 7, None, None, "0000:00", SW, (2.5, 1, 2.5, 1),
     ((0, 131072, "32"), (1, 131072, "32"), (2, 32, "io"), (3, 16384, "32")), "0-2"),
    ("0000:80:00.0", "1b36:000c", 0x060400, 8, "pcieport", 1, "0000:80", (), (2.5, 1, 8.0, 4),
     ((0, 4096, "32"),), None),
    ("0000:81:00.0", "1b36:0010", 0x010802, 9, None, 1, "0000:80", ("0000:80:00.0",), (2.5, 1, 2.5, 1),
     ((0, 16384, "64"),), "5"),
]  # fmt: skip


def summary(f: PciFunction) -> tuple[object, ...]:
    """A function as one row of QEMU_EXPECTED; BAR kind: io, or 32/64 plus p when prefetchable."""
    link = None if f.link is None else astuple(f.link)
    kinds = [
        ("io" if b.is_io else "64" if b.is_64bit else "32") + ("p" if b.prefetchable else "") for b in f.bars
    ]
    bars = tuple((b.index, b.size, kind) for b, kind in zip(f.bars, kinds, strict=True))
    return (f.address, f.id, f.class_code, f.iommu_group, f.driver, f.numa_node, f.root_bus, f.parents, link,
            bars, f.physical_slot)  # fmt: skip


def test_real_kernel_capture_with_iommu_switch_and_numa() -> None:
    lines = (FIXTURES / "pci_hardware_qemu_q35_iommu_numa.txt").read_text().splitlines()[1:]
    hardware = parse_hardware(lines)
    assert hardware.iommu_present
    assert [summary(f) for f in hardware.functions] == QEMU_EXPECTED


def test_live_sys_of_this_machine() -> None:
    """The command on the real kernel running the tests: every function listed, ids as the kernel says."""
    devices = Path("/sys/bus/pci/devices")
    if not devices.is_dir():
        pytest.skip("no /sys/bus/pci/devices on this machine")
    hardware = read_hardware_locally(Path("/sys"))
    assert [f.address for f in hardware.functions] == sorted(os.listdir(devices))
    for function in hardware.functions:
        assert f"0x{function.vendor}" == (devices / function.address / "vendor").read_text().strip()
        assert f"0x{function.class_code:06x}" == (devices / function.address / "class").read_text().strip()
    assert hardware.iommu_present == any(Path("/sys/class/iommu").glob("*"))


# --- kernel-like trees (synthesized) ----------------------------------------------------------------------

ZERO = "0x0000000000000000 0x0000000000000000 0x0000000000000000"


@dataclass(frozen=True)
class FakeFunction:
    """One function of a synthesized tree: `path` below devices/, attribute files written verbatim."""

    path: str
    files: dict[str, str]
    driver: str | None = None
    group: int | None = None

    @property
    def address(self) -> str:
        return self.path.rsplit("/", 1)[1]


def attributes(
    ids: str, subsystem: str, class_code: int, numa: int | None, link: tuple[str, str, str, str] | None
) -> dict[str, str]:
    vendor, device = ids.split(":")
    svendor, sdevice = subsystem.split(":")
    files = {
        "vendor": f"0x{vendor}\n",
        "device": f"0x{device}\n",
        "subsystem_vendor": f"0x{svendor}\n",
        "subsystem_device": f"0x{sdevice}\n",
        "class": f"0x{class_code:06x}\n",
        "revision": "0xa1\n",  # not read: must not disturb anything
    }
    if numa is not None:
        files["numa_node"] = f"{numa}\n"
    if link is not None:
        names = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
        files.update({name: f"{value}\n" for name, value in zip(names, link, strict=True)})
    return files


def resource(*lines: str, total: int = 13) -> str:
    """A `resource` file: the given lines, then zero lines up to `total` (13 = 6 BARs + ROM + 6 VF BARs)."""
    return "".join(f"{line}\n" for line in (*lines, *([ZERO] * (total - len(lines)))))


def write_tree(
    root: Path,
    functions: list[FakeFunction],
    slots: dict[str, str] | None = None,
    iommus: tuple[str, ...] = (),
) -> None:
    """Write a kernel-like sysfs tree; every link is relative, like the kernel's."""
    (root / "bus/pci/devices").mkdir(parents=True)
    for function in functions:
        directory = root / "devices" / function.path
        directory.mkdir(parents=True)
        for name, content in function.files.items():
            (directory / name).write_text(content)
        up = "../" * (function.path.count("/") + 2)
        if function.driver is not None:
            (root / "bus/pci/drivers" / function.driver).mkdir(parents=True, exist_ok=True)
            (directory / "driver").symlink_to(f"{up}bus/pci/drivers/{function.driver}")
        if function.group is not None:
            (root / "kernel/iommu_groups" / str(function.group) / "devices").mkdir(
                parents=True, exist_ok=True
            )
            (directory / "iommu_group").symlink_to(f"{up}kernel/iommu_groups/{function.group}")
        (root / "bus/pci/devices" / function.address).symlink_to(f"../../../devices/{function.path}")
    for name, address in (slots or {}).items():
        (root / "bus/pci/slots" / name).mkdir(parents=True)
        (root / "bus/pci/slots" / name / "address").write_text(f"{address}\n")
    for name in iommus:
        (root / "class/iommu" / name).mkdir(parents=True)


GEN5_X16 = ("32.0 GT/s PCIe", "16", "32.0 GT/s PCIe", "16")
GPU_RESOURCE = resource(
    "0x00000000f0000000 0x00000000f3ffffff 0x0000000000040200",  # BAR0 64 MiB, 32-bit
    "0x0000018000000000 0x0000019fffffffff 0x000000000014220c",  # BAR1 128 GiB, 64-bit prefetchable
    ZERO,  # upper half of BAR1
    "0x000001a000000000 0x000001a001ffffff 0x000000000014220c",  # BAR3 32 MiB, 64-bit prefetchable
    ZERO,
    "0x000000000000f000 0x000000000000f07f 0x0000000000040101",  # BAR5 I/O
    "0x00000000f4000000 0x00000000f407ffff 0x0000000000046200",  # expansion ROM 512 KiB
    "0x0000020000000000 0x000002003fffffff 0x000000000014220c",  # VF BAR 0: not a BAR of the function
)
# A bridge lists 17 lines (IOV kernel): here a BAR at line 0, and a memory window at line 14 (not a BAR).
BRIDGE_RESOURCE = resource(
    "0x00000000f0000000 0x00000000f40fffff 0x0000000000000200",
    *([ZERO] * 13),
    "0x00000000f0000000 0x00000000f41fffff 0x0000000000000200",
    total=17,
)

TREE = [
    FakeFunction("pci0000:00/0000:00:00.0", attributes("1022:14a4", "1022:14a4", 0x060000, None, None)),
    FakeFunction(
        "pci0000:40/0000:40:01.1",
        {**attributes("1022:14ab", "1022:1453", 0x060400, 0, GEN5_X16), "resource": resource(total=17)},
        driver="pcieport",
        group=10,
    ),
    FakeFunction(
        "pci0000:40/0000:40:01.1/0000:41:00.0",
        {**attributes("10de:2bb1", "10de:204b", 0x030000, 0, GEN5_X16), "resource": GPU_RESOURCE},
        driver="vfio-pci",
        group=11,
    ),
    FakeFunction(
        "pci0000:40/0000:40:01.1/0000:41:00.1",
        {
            **attributes("10de:22e8", "10de:204b", 0x040300, 0, GEN5_X16),
            "resource": resource("0x00000000f4080000 0x00000000f4083fff 0x0000000000040200"),
        },
        driver="vfio-pci",
        group=11,
    ),
    FakeFunction(
        "pci0000:c0/0000:c0:01.1",
        {**attributes("1022:14ab", "1022:1453", 0x060400, 1, GEN5_X16), "resource": BRIDGE_RESOURCE},
        driver="pcieport",
        group=20,
    ),
    FakeFunction(
        "pci0000:c0/0000:c0:01.1/0000:c1:00.0",
        attributes("1000:c030", "1000:a064", 0x060400, 1, ("8 GT/s", "16", "16 GT/s", "16")),
        driver="pcieport",
        group=21,
    ),
    FakeFunction(
        "pci0000:c0/0000:c0:01.1/0000:c1:00.0/0000:c2:00.0",
        attributes("1000:c030", "1000:a064", 0x060400, 1, ("Unknown speed", "0", "16.0 GT/s PCIe", "4")),
        group=22,
    ),
    FakeFunction(
        "pci0000:c0/0000:c0:01.1/0000:c1:00.0/0000:c2:00.0/0000:c3:00.0",
        attributes("144d:a80a", "144d:a801", 0x010802, 1, ("16.0 GT/s PCIe", "4", "16.0 GT/s PCIe", "4")),
        driver="nvme",
        group=23,
    ),
]


GEN5 = Link(current_speed_gts=32.0, current_width=16, max_speed_gts=32.0, max_width=16)
MIB = 1 << 20


def mem(index: int, start: int, size: int, *, is_64bit: bool = False, prefetchable: bool = False) -> Bar:
    return Bar(index=index, start=start, size=size, is_64bit=is_64bit, prefetchable=prefetchable, is_io=False)


def fn(
    address: str,
    ids: str,
    subsystem: str,
    class_code: int,
    root_bus: str,
    *,
    driver: str | None = None,
    group: int | None = None,
    numa: int | None = None,
    parents: tuple[str, ...] = (),
    link: Link | None = None,
    bars: tuple[Bar, ...] = (),
    slot: str | None = None,
) -> PciFunction:
    vendor, device = ids.split(":")
    subsystem_vendor, subsystem_device = subsystem.split(":")
    return PciFunction(
        address=address,
        vendor=vendor,
        device=device,
        subsystem_vendor=subsystem_vendor,
        subsystem_device=subsystem_device,
        class_code=class_code,
        driver=driver,
        iommu_group=group,
        numa_node=numa,
        root_bus=root_bus,
        parents=parents,
        link=link,
        bars=bars,
        physical_slot=slot,
    )


GPU_BARS = (
    mem(0, 0xF0000000, 64 * MIB),
    mem(1, 0x18000000000, 128 << 30, is_64bit=True, prefetchable=True),
    mem(3, 0x1A000000000, 32 * MIB, is_64bit=True, prefetchable=True),
    Bar(index=5, start=0xF000, size=128, is_64bit=False, prefetchable=False, is_io=True),
    mem(6, 0xF4000000, 512 << 10, prefetchable=True),
)
PORT_40 = ("0000:40:01.1",)
SWITCH = ("0000:c0:01.1", "0000:c1:00.0", "0000:c2:00.0")
EXPECTED_TREE = HostHardware(
    functions=(
        fn("0000:00:00.0", "1022:14a4", "1022:14a4", 0x060000, "0000:00"),
        fn("0000:40:01.1", "1022:14ab", "1022:1453", 0x060400, "0000:40", driver="pcieport", group=10, numa=0,
           link=GEN5),
        fn("0000:41:00.0", "10de:2bb1", "10de:204b", 0x030000, "0000:40", driver="vfio-pci", group=11, numa=0,
           parents=PORT_40, link=GEN5, bars=GPU_BARS, slot="7"),
        fn("0000:41:00.1", "10de:22e8", "10de:204b", 0x040300, "0000:40", driver="vfio-pci", group=11, numa=0,
           parents=PORT_40, link=GEN5, bars=(mem(0, 0xF4080000, 16 << 10),), slot="7"),
        fn("0000:c0:01.1", "1022:14ab", "1022:1453", 0x060400, "0000:c0", driver="pcieport", group=20, numa=1,
           link=GEN5, bars=(mem(0, 0xF0000000, 0x4100000),)),
        fn("0000:c1:00.0", "1000:c030", "1000:a064", 0x060400, "0000:c0", driver="pcieport", group=21, numa=1,
           parents=SWITCH[:1], link=Link(8.0, 16, 16.0, 16)),
        fn("0000:c2:00.0", "1000:c030", "1000:a064", 0x060400, "0000:c0", group=22, numa=1,
           parents=SWITCH[:2], link=Link(None, 0, 16.0, 4)),
        fn("0000:c3:00.0", "144d:a80a", "144d:a801", 0x010802, "0000:c0", driver="nvme", group=23, numa=1,
           parents=SWITCH, link=Link(16.0, 4, 16.0, 4)),
    ),
    iommu_present=True,
)  # fmt: skip


def test_tree_anywhere_reads_exactly(tmp_path: Path) -> None:
    """A tree at a path with a space and a quote: groups, drivers, NUMA, chains, links, BARs, slots."""
    root = tmp_path / "captured sys of bob's host"
    write_tree(root, TREE, slots={"7": "0000:41:00", "12": "0000:e1:00"}, iommus=("ivhd0", "ivhd1"))
    assert read_hardware_locally(root) == EXPECTED_TREE


def test_empty_tree_is_no_hardware_not_an_error(tmp_path: Path) -> None:
    assert read_hardware_locally(tmp_path) == HostHardware(functions=(), iommu_present=False)


def test_iommu_without_pci_devices(tmp_path: Path) -> None:
    write_tree(tmp_path, [], iommus=("dmar0",))
    assert read_hardware_locally(tmp_path) == HostHardware(functions=(), iommu_present=True)


def test_missing_root_is_a_command_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    message = f"hardware command failed (exit 1): pvegpu: sysfs root {missing} is not a readable directory"
    with pytest.raises(FactCommandError, match="^" + re.escape(message) + "$"):
        read_hardware_locally(missing)


def test_ambiguous_slot_is_not_reported(tmp_path: Path) -> None:
    write_tree(tmp_path, TREE[:3], slots={"7": "0000:41:00", "SLOT7": "0000:41:00"})
    gpu = read_hardware_locally(tmp_path).by_address["0000:41:00.0"]
    assert gpu.physical_slot is None


def test_slot_known_only_by_bus(tmp_path: Path) -> None:
    """`address` is DDDD:BB when the kernel does not know the device number (slot->number 0xff)."""
    write_tree(tmp_path, TREE[:3], slots={"3": "0000:41"})
    assert read_hardware_locally(tmp_path).by_address["0000:41:00.0"].physical_slot == "3"


def test_command_quotes_the_root() -> None:
    assert hardware_command("/tmp/a b'c").splitlines()[0] == "S='/tmp/a b'\"'\"'c'"
    assert hardware_command().splitlines()[0] == "S=/sys"


def _wrap(tools: Path, log: Path, name: str) -> None:
    real = shutil.which(name)
    assert real is not None
    script = tools / name
    script.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec {real} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (0, ["grep", "grep"]),
        (1, ["grep", "grep", "find", "find", "grep"]),
        (40, ["grep", "grep", "find", "find", "grep"]),
    ],
)
def test_processes_do_not_grow_with_devices(tmp_path: Path, gpus: int, expected: list[str]) -> None:
    """Only `find` and `grep` are external (the rest are sh builtins), each run once whatever the count."""
    tools, log = tmp_path / "bin", tmp_path / "log"
    tools.mkdir()
    for name in ("find", "grep"):
        _wrap(tools, log, name)
    root = write_gpus(tmp_path / "sys", gpus)
    script = hardware_command(str(root))
    result = subprocess.run(
        ["/bin/sh", "-c", script], env={"PATH": str(tools)}, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert len(parse_hardware(result.stdout.splitlines()).functions) == 2 * gpus
    assert log.read_text().split() == expected


def write_gpus(root: Path, count: int) -> Path:
    """`count` GPUs, each behind its own root port on its own root bus (synthesized)."""
    functions = []
    for i in range(count):
        port = f"pci0000:{i:02x}/0000:{i:02x}:01.1"
        functions.append(FakeFunction(port, attributes("1022:14ab", "1022:1453", 0x060400, 0, GEN5_X16)))
        gpu = attributes("10de:2bb1", "10de:204b", 0x030000, 0, GEN5_X16)
        functions.append(FakeFunction(f"{port}/0000:{i + 100:02x}:00.0", gpu, "vfio-pci", i))
    write_tree(root, functions)
    return root


# --- the lab's generated reference box (lab.fakesys) -----------------------------------------------------


@pytest.mark.parametrize("topology", ["reference", "reference-renumbered"])
def test_lab_tree_reads_back_as_its_manifest_and_description(tmp_path: Path, topology: str) -> None:
    """lab.fakesys writes a tree from a topology description; the fact reads every function back as the
    manifest lists it, and the links and BAR sizes the description states."""
    manifest = fakesys.write_tree(tmp_path / "sys", topology)
    hardware = read_hardware_locally(tmp_path / "sys")
    assert hardware.iommu_present
    assert {f.address for f in hardware.functions} == set(manifest["devices"])
    for address, entry in manifest["devices"].items():
        f = hardware.by_address[address]
        assert {
            "vendor": f.vendor,
            "device": f.device,
            "subsystem_vendor": f.subsystem_vendor,
            "subsystem_device": f.subsystem_device,
            "class": f"0x{f.class_code:06x}",
            "driver": f.driver,
            "iommu_group": f.iommu_group,
            "numa_node": f.numa_node,
            "root_bus": f.root_bus,
            "parents": list(f.parents),
            "path": entry["path"],
            "physical_slot": f.physical_slot,
        } == entry
    for number, members in manifest["groups"].items():
        assert [f.address for f in hardware.group_members(int(number))] == members
    # 8 GPUs, each with its HDMI audio function in one group, on 8 root complexes, 4 per NUMA node.
    gpus = [f for f in hardware.functions if f.vendor == "10de" and f.class_base == 0x0300]
    audio = [f for f in hardware.functions if f.vendor == "10de" and f.class_base == 0x0403]
    assert len(gpus) == len(audio) == 8
    assert [(f.slot_address, f.iommu_group) for f in gpus] == [(f.slot_address, f.iommu_group) for f in audio]
    assert len({f.root_bus for f in gpus}) == 8
    assert Counter(f.numa_node for f in gpus) == {0: 4, 1: 4}
    assert {tuple(g["functions"]) for g in manifest["gpus"]} == {
        (gpu.address, sound.address) for gpu, sound in zip(gpus, audio, strict=True)
    }
    for placed in place(TOPOLOGIES[topology]):
        f = hardware.by_address[placed.address]
        stated = placed.function.link
        assert f.link == (
            None
            if stated is None
            else Link(
                float(stated.current_speed.split()[0]),
                stated.current_width,
                float(stated.max_speed.split()[0]),
                stated.max_width,
            )
        )
        expected_bars = {
            (bar.index, bar.size, bar.space.value == "mem64", bar.prefetchable, bar.space.value == "io")
            for bar in placed.function.bars
        }
        if placed.function.rom_size:
            expected_bars.add((6, placed.function.rom_size, False, True, False))
        bars = {(b.index, b.size, b.is_64bit, b.prefetchable, b.is_io) for b in f.bars}
        assert bars == expected_bars, placed.address


# --- garbled output: a per-host error naming what was wrong -------------------------------------------------


def edited(old: str, new: str | None) -> list[str]:
    """The real capture with its first line equal to `old` replaced (None: removed)."""
    lines = capture_lines()
    index = lines.index(old)
    return lines[:index] + ([] if new is None else [new]) + lines[index + 1 :]


GARBLED = [
    pytest.param([], "truncated output: the #pvegpu:iommu marker is missing", id="empty"),
    pytest.param(capture_lines()[:-1], "truncated output: the #pvegpu:end marker is missing", id="truncated"),
    pytest.param(
        ["Last login: Mon", *capture_lines()],
        "line 1: 'Last login: Mon' before the first section marker",
        id="noise-first",
    ),
    pytest.param([*capture_lines(), "x"], "line 98: 'x' after the end marker", id="noise-after-end"),
    pytest.param(
        edited("#pvegpu:slots", "#pvegpu:bogus"),
        "line 2: unknown section marker '#pvegpu:bogus'",
        id="marker",
    ),
    pytest.param(
        edited("#pvegpu:slots", None), "line 2: '#pvegpu:nodes' where #pvegpu:slots belongs", id="order"
    ),
    pytest.param(
        edited("0000:00:00.0/vendor:0x8086", "0000:00:00.0/vendor:0x80861"),
        "0000:00:00.0: vendor: expected 0x%04x, got '0x80861'",
        id="bad-hex",
    ),
    pytest.param(
        edited("0000:00:03.0/vendor:0x1af4", None),
        "0000:00:03.0: vendor: missing (no such attribute file, or it is empty)",
        id="no-vendor",
    ),
    pytest.param(
        edited("0000:00:02.0/class:0x018000", "0000:00:02.0/class:"),
        "0000:00:02.0: class: expected 0x%06x, got ''",
        id="empty-class",
    ),
    pytest.param(
        edited("0000:00:04.0/numa_node:-1", "0000:00:04.0/numa_node:zero"),
        "0000:00:04.0: numa_node: expected a node number or -1, got 'zero'",
        id="numa",
    ),
    pytest.param(
        edited(
            "0000:00:01.0/resource:0x0000004000000000 0x000000400007ffff 0x0000000000140204",
            "0000:00:01.0/resource:0x0000004000000000 0x000000400007ffff",
        ),
        "0000:00:01.0: resource: line 0: expected '0x%016llx 0x%016llx 0x%016llx', "
        "got '0x0000004000000000 0x000000400007ffff'",
        id="truncated-resource",
    ),
    pytest.param(
        edited("0000:00:05.0/numa_node:-1", "0000:00:05.0/numa_node:-1\n0000:00:05.0/numa_node:0"),
        "0000:00:05.0: numa_node: more than one line (line 55)",
        id="duplicate",
    ),
    pytest.param(
        edited("0000:00:05.0/vendor:0x1af4", "0000:00:09.0/vendor:0x1af4"),
        "line 24: '0000:00:09.0' is not in the device list",
        id="unknown-device",
    ),
    pytest.param(
        edited("0000:00:05.0/vendor:0x1af4", "0000:00:05.0/color:blue"),
        "line 24: expected '<address>/<attribute>:<value>', got '0000:00:05.0/color:blue'",
        id="unknown-attribute",
    ),
    pytest.param(
        edited(
            "0000:00:02.0 ../../../devices/pci0000:00/0000:00:02.0",
            "0000:00:02.0 ../../../devices/0000:00:02.0",
        ),
        "0000:00:02.0: device link: target '../../../devices/0000:00:02.0' "
        "has no pciDDDD:BB root bus element",
        id="no-root-bus",
    ),
    pytest.param(
        edited(
            "0000:00:02.0 ../../../devices/pci0000:00/0000:00:02.0",
            "0000:00:02.0 ../../../devices/pci0000:00/0000:00:03.0",
        ),
        "0000:00:02.0: device link: target '../../../devices/pci0000:00/0000:00:03.0' "
        "does not end in 0000:00:02.0",
        id="link-mismatch",
    ),
    pytest.param(
        edited("0000:00:02.0 ../../../devices/pci0000:00/0000:00:02.0", "0000:00:02.0"),
        "line 8: expected '<address> <link target>', got '0000:00:02.0'",
        id="truncated-device",
    ),
    pytest.param(
        edited(
            "0000:00:01.0 driver ../../../bus/pci/drivers/virtio-pci",
            "0000:00:01.0 iommu_group ../../../../kernel/iommu_groups/x",
        ),
        "0000:00:01.0: iommu_group: link target '../../../../kernel/iommu_groups/x' "
        "does not end in a group number",
        id="group",
    ),
    pytest.param(
        edited("0000:00:01.0 driver ../../../bus/pci/drivers/virtio-pci", "0000:00:01.0 firmware x"),
        "line 13: expected '<address> driver|iommu_group <target>', got '0000:00:01.0 firmware x'",
        id="unknown-link",
    ),
    pytest.param(
        edited("#pvegpu:nodes", "bus/pci/slots/7/address:41:00\n#pvegpu:nodes"),
        "line 3: expected 'bus/pci/slots/<name>/address:<DDDD:BB:DD>', got 'bus/pci/slots/7/address:41:00'",
        id="slot",
    ),
    pytest.param(
        edited("devices/system/node/node0/cpulist:0-1", "devices/system/node/node0/cpumap:3"),
        "line 4: expected 'devices/system/node/node<N>/cpulist:<list>', "
        "got 'devices/system/node/node0/cpumap:3'",
        id="node-file",
    ),
    pytest.param(
        edited("devices/system/node/node0/cpulist:0-1", "devices/system/node/node0/cpulist:4-1"),
        "line 4: node0 cpulist: ranges must ascend without overlap, got '4-1'",
        id="node-range",
    ),
    pytest.param(
        edited("devices/system/node/node0/cpulist:0-1", "devices/system/node/node0/cpulist:0-1,x"),
        "line 4: node0 cpulist: expected a list like 0-31,64-95, got '0-1,x'",
        id="node-list",
    ),
    pytest.param(
        edited(
            "devices/system/node/node0/cpulist:0-1",
            "devices/system/node/node0/cpulist:0-1\ndevices/system/node/node0/cpulist:2",
        ),
        "line 5: NUMA node 0 listed twice",
        id="node-twice",
    ),
]


def _split(lines: list[str]) -> list[str]:
    """Entries holding a newline stand for two output lines (insertions above)."""
    return [part for line in lines for part in line.split("\n")]


@pytest.mark.parametrize(("lines", "message"), GARBLED)
def test_garbled_output_names_what_is_wrong(lines: list[str], message: str) -> None:
    with pytest.raises(FactParseError, match="^" + re.escape(message) + "$"):
        parse_hardware(_split(lines))


def test_mutated_real_output_parses_or_names_an_error() -> None:
    """500 seeded random edits of the QEMU capture (drop, duplicate, change, cut a line): a result or a
    FactParseError, never another exception."""
    base = (FIXTURES / "pci_hardware_qemu_q35_iommu_numa.txt").read_text().splitlines()[1:]
    rng = random.Random(7)
    outcomes = {"parsed": 0, "error": 0}
    for _ in range(500):
        lines = list(base)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(lines))
            edit = rng.randrange(4)
            if edit == 0:
                del lines[i]
            elif edit == 1:
                lines.insert(i, rng.choice(lines))
            elif edit == 2:
                j = rng.randrange(len(lines[i]) + 1)
                lines[i] = lines[i][:j] + rng.choice("0123456789abcdefx:./ -#\t²é") + lines[i][j + 1 :]
            else:
                lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        try:
            parse_hardware(lines)
            outcomes["parsed"] += 1
        except FactParseError:
            outcomes["error"] += 1
    assert outcomes["parsed"] > 0
    assert outcomes["error"] > 0


def test_link_speed_error_names_the_attribute(tmp_path: Path) -> None:
    gpu = TREE[2]
    broken = replace(gpu, files={**gpu.files, "max_link_speed": "fast\n"})
    write_tree(tmp_path, [TREE[1], broken])
    message = "0000:41:00.0: max_link_speed: expected '<float> GT/s[ PCIe]' or 'Unknown', got 'fast'"
    with pytest.raises(FactParseError, match="^" + re.escape(message) + "$"):
        read_hardware_locally(tmp_path)


# --- through pyinfra: a parse error fails that host only, with the message --------------------------------


def test_pyinfra_reports_a_parse_error_per_host(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gpu = TREE[2]
    write_tree(tmp_path, [TREE[1], replace(gpu, files={**gpu.files, "vendor": "0x10dex\n"})])
    state, local = local_state("other.invalid")
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        result = get_fact(state, local, PciHardware, kwargs={"sysfs_root": str(tmp_path)})
    assert result == HostHardware(functions=(), iommu_present=False)
    assert state.failed_hosts == {local}
    assert [host.name for host in state.active_hosts] == ["other.invalid"]
    assert "FactParseError: 0000:41:00.0: vendor: expected 0x%04x, got '0x10dex'" in caplog.text
    assert "could not process fact: pvegpu.facts.hardware.PciHardware" in caplog.text


def test_pyinfra_fact_on_a_good_tree(tmp_path: Path) -> None:
    write_tree(tmp_path, TREE, slots={"7": "0000:41:00"}, iommus=("ivhd0",))
    state, local = local_state()
    assert get_fact(state, local, PciHardware, kwargs={"sysfs_root": str(tmp_path)}) == EXPECTED_TREE
