"""The lab's fake sysfs: topology layout, the kernel's grouping rules, the tree's files, the QEMU realization.

Evidence: shared/fixtures/real-kernel/qemu-q35-intel-iommu-linux-6.1-probe.txt, IOMMU groups computed by a
real Debian 6.1 kernel (QEMU 7.2 q35, intel-iommu) for root ports, a pxb-pcie root complex, x3130 switches
under root ports with and without ACS, multifunction root ports with and without ACS. Found via env
PVEGPU_SHARED (default `<repo>/../shared`); those tests skip, naming the path, when it is absent.
The kernel tier (tests/kernel) does the same comparison live, for every lab topology.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from lab import fakesys
from lab.grouping import iommu_groups
from lab.kernel.qemu import parse_probe, realize
from lab.topologies import TOPOLOGIES, gpu_card, qemu_root_port
from lab.topology import Device, Function, Kind, RootComplex, Topology, TopologyError, place
from pvegpu.facts.hardware import read_hardware_locally

REPO = Path(__file__).resolve().parents[3]
PROBE = "qemu-q35-intel-iommu-linux-6.1-probe.txt"


def real_kernel_probe() -> str:
    shared = Path(os.environ.get("PVEGPU_SHARED", REPO.parent / "shared"))
    path = shared / "fixtures" / "real-kernel" / PROBE
    if not path.is_file():
        pytest.skip(f"real-kernel capture {path} not found (set PVEGPU_SHARED to the shared folder)")
    return path.read_text()


def partition(groups: dict[str, int]) -> set[frozenset[str]]:
    """The sets of functions that share a group, whatever the groups' numbers."""
    members: dict[int, set[str]] = {}
    for name, group in groups.items():
        members.setdefault(group, set()).add(name)
    return {frozenset(m) for m in members.values()}


# --- the grouping model against the real kernel -------------------------------------------------------------


def test_generator_groups_match_the_real_kernel_probe() -> None:
    kernel = parse_probe(real_kernel_probe())
    realized = place(realize(TOPOLOGIES["qemu-probe"], "intel").topology)
    groups = iommu_groups(realized)

    assert partition(groups) == partition({p.address: p.group for p in kernel if p.group is not None})
    # Stronger than the partition: same functions at the same places, and the same group numbers, since the
    # model numbers groups in the kernel's probe order.
    assert {
        p.address: (p.key, p.function.vendor, p.function.device, p.function.class_code) for p in realized
    } == {p.address: (p.key, p.vendor, p.device, p.class_code) for p in kernel}
    assert groups == {p.address: p.group for p in kernel}


def test_the_probe_layouts_cover_every_grouping_rule() -> None:
    """The capture holds each case the model distinguishes; a group per case, as the kernel computed it."""
    groups = {p.address: p.group for p in parse_probe(real_kernel_probe())}

    def members(address: str) -> list[str]:
        return sorted(a for a, g in groups.items() if g == groups[address])

    # GPU + audio behind a root port with ACS: together (multifunction without ACS), nothing else.
    assert members("0000:01:00.0") == ["0000:01:00.0", "0000:01:00.1"]
    # Switch without downstream ACS under a root port with ACS: each endpoint with ITS downstream port.
    assert members("0000:07:00.0") == ["0000:06:00.0", "0000:07:00.0"]
    assert members("0000:08:00.0") == ["0000:06:01.0", "0000:08:00.0"]
    # Two root ports of one slot without ACS: both ports and both endpoints in one group.
    assert members("0000:0a:00.0") == ["0000:00:08.0", "0000:00:08.1", "0000:09:00.0", "0000:0a:00.0"]
    # The same with ACS: separate.
    assert members("0000:0b:00.0") == ["0000:0b:00.0"]
    assert members("0000:0c:00.0") == ["0000:0c:00.0"]
    # Root port without ACS above a switch: the port, the whole switch and its endpoints in one group.
    assert members("0000:10:00.0") == [
        "0000:00:0a.0",
        "0000:0d:00.0",
        "0000:0e:00.0",
        "0000:0e:01.0",
        "0000:0f:00.0",
        "0000:10:00.0",
    ]
    # A second root complex (pxb-pcie) behaves like the first.
    assert members("0000:81:00.0") == ["0000:81:00.0"]


# --- the named boxes ----------------------------------------------------------------------------------------

REFERENCE_GPUS = [
    # index, address, group, NUMA node, root bus, physical slot
    (0, "0000:41:00", 14, 0, "0000:40", "1"),
    (1, "0000:51:00", 17, 0, "0000:50", "2"),
    (2, "0000:61:00", 20, 0, "0000:60", "3"),
    (3, "0000:71:00", 23, 0, "0000:70", "4"),
    (4, "0000:c1:00", 29, 1, "0000:c0", "5"),
    (5, "0000:d1:00", 32, 1, "0000:d0", "6"),
    (6, "0000:e1:00", 35, 1, "0000:e0", "7"),
    (7, "0000:f1:00", 38, 1, "0000:f0", "8"),
]


def gpu_rows(manifest: fakesys.Manifest) -> list[tuple[object, ...]]:
    return [
        (g["index"], g["address"], g["iommu_group"], g["numa_node"], g["root_bus"], g["physical_slot"])
        for g in manifest["gpus"]
    ]


def test_reference_box() -> None:
    manifest = fakesys.manifest("reference")
    groups = manifest["groups"]

    assert gpu_rows(manifest) == REFERENCE_GPUS
    for gpu in manifest["gpus"]:
        assert (
            groups[str(gpu["iommu_group"])]
            == gpu["functions"]
            == [gpu["address"] + ".0", gpu["address"] + ".1"]
        )
    assert manifest["devices"]["0000:41:00.0"] == {
        "vendor": "10de",
        "device": "2bb1",
        "subsystem_vendor": "10de",
        "subsystem_device": "204b",
        "class": "0x030000",
        "driver": "nvidia",
        "iommu_group": 14,
        "numa_node": 0,
        "root_bus": "0000:40",
        "parents": ["0000:40:01.1"],
        "path": "devices/pci0000:40/0000:40:01.1/0000:41:00.0",
        "physical_slot": "1",
    }
    # Host I/O on root complex 00, each in its own group: dual-port NIC, NVMe, USB, BMC VGA with its bridge.
    assert groups["8"] == ["0000:01:00.0", "0000:01:00.1"]
    assert groups["9"] == ["0000:02:00.0"]
    assert groups["10"] == ["0000:03:00.0"]
    assert groups["11"] == ["0000:04:00.0", "0000:05:00.0"]
    # An AMD root complex's own host bridge and IOMMU functions have no group; its dummy host bridge has.
    devices = manifest["devices"]
    assert [devices[a]["iommu_group"] for a in ("0000:40:00.0", "0000:40:00.2", "0000:40:01.0")] == [
        None,
        None,
        12,
    ]
    assert len(groups) == 39


def test_renumbered_box_keeps_cards_slots_and_order_but_not_numbers() -> None:
    reference = fakesys.manifest("reference")
    renumbered = fakesys.manifest("reference-renumbered")

    assert gpu_rows(renumbered) == [
        (0, "0000:21:00", 16, 0, "0000:20", "1"),
        (1, "0000:31:00", 19, 0, "0000:30", "2"),
        (2, "0000:41:00", 22, 0, "0000:40", "3"),
        (3, "0000:51:00", 25, 0, "0000:50", "4"),
        (4, "0000:a1:00", 31, 1, "0000:a0", "5"),
        (5, "0000:b1:00", 34, 1, "0000:b0", "6"),
        (6, "0000:c1:00", 37, 1, "0000:c0", "7"),
        (7, "0000:d1:00", 40, 1, "0000:d0", "8"),
    ]
    for before, after in zip(reference["gpus"], renumbered["gpus"], strict=True):
        assert (after["physical_slot"], after["numa_node"]) == (before["physical_slot"], before["numa_node"])
        assert after["iommu_group"] != before["iommu_group"]
    # The trap: reference gpu0's address now belongs to another card (slot 3), in another group.
    assert renumbered["devices"]["0000:41:00.0"]["physical_slot"] == "3"


@pytest.mark.parametrize(
    ("topology", "gpu0_group", "gpu0_members"),
    [
        ("switches", 17, ["0000:43:00.0", "0000:43:00.1"]),
        ("switches-noacs", 15, ["0000:42:00.0", "0000:43:00.0", "0000:43:00.1"]),
    ],
)
def test_switch_boxes(topology: str, gpu0_group: int, gpu0_members: list[str]) -> None:
    manifest = fakesys.manifest(topology)

    assert [g["address"] for g in manifest["gpus"]] == [
        "0000:43:00",
        "0000:44:00",
        "0000:63:00",
        "0000:64:00",
        "0000:c3:00",
        "0000:c4:00",
        "0000:e3:00",
        "0000:e4:00",
    ]
    assert manifest["gpus"][0]["iommu_group"] == gpu0_group
    assert manifest["groups"][str(gpu0_group)] == gpu0_members
    # Both cards behind one switch: never in one group (the downstream ports keep the branches apart).
    assert manifest["gpus"][0]["iommu_group"] != manifest["gpus"][1]["iommu_group"]
    assert manifest["devices"]["0000:43:00.0"]["parents"] == ["0000:40:01.1", "0000:41:00.0", "0000:42:00.0"]


def test_shared_with_nic_puts_gpu3_and_a_nic_in_one_group() -> None:
    manifest = fakesys.manifest("shared-with-nic")
    gpu3 = manifest["gpus"][3]

    assert (gpu3["address"], gpu3["iommu_group"], gpu3["physical_slot"]) == ("0000:73:00", 21, "4")
    members = manifest["groups"]["21"]
    assert members == [
        "0000:70:01.0",
        "0000:70:01.1",
        "0000:71:00.0",
        "0000:72:00.0",
        "0000:72:01.0",
        "0000:73:00.0",
        "0000:73:00.1",
        "0000:74:00.0",
    ]
    assert [manifest["devices"][m]["class"] for m in members] == [
        "0x060000",
        "0x060400",
        "0x060400",
        "0x060400",
        "0x060400",
        "0x030000",
        "0x040300",
        "0x020000",
    ]
    others = [g for g in manifest["gpus"] if g["index"] != 3]
    assert all(manifest["groups"][str(g["iommu_group"])] == g["functions"] for g in others)


def test_missing_gpu_box_loses_slot_4_and_one_group_number_after_it() -> None:
    manifest = fakesys.manifest("reference-missing-gpu")

    # Slot 4's card is gone; the buses stay, and every group probed after it is one lower (28 was 29).
    assert gpu_rows(manifest) == [
        (0, "0000:41:00", 14, 0, "0000:40", "1"),
        (1, "0000:51:00", 17, 0, "0000:50", "2"),
        (2, "0000:61:00", 20, 0, "0000:60", "3"),
        (3, "0000:c1:00", 28, 1, "0000:c0", "5"),
        (4, "0000:d1:00", 31, 1, "0000:d0", "6"),
        (5, "0000:e1:00", 34, 1, "0000:e0", "7"),
        (6, "0000:f1:00", 37, 1, "0000:f0", "8"),
    ]
    assert "0000:71:00.0" not in manifest["devices"]
    # Its root port stays, empty, alone in its group.
    assert manifest["groups"][str(manifest["devices"]["0000:70:01.1"]["iommu_group"])] == ["0000:70:01.1"]
    assert all(manifest["groups"][str(g["iommu_group"])] == g["functions"] for g in manifest["gpus"])
    assert len(manifest["groups"]) == 38


def test_other_card_box_holds_an_rtx_6000_ada_in_slot_6() -> None:
    reference = fakesys.manifest("reference")
    manifest = fakesys.manifest("reference-other-card")

    assert gpu_rows(manifest) == REFERENCE_GPUS
    assert manifest["groups"] == reference["groups"]
    ada, audio = manifest["devices"]["0000:d1:00.0"], manifest["devices"]["0000:d1:00.1"]
    assert (ada["vendor"], ada["device"], ada["subsystem_vendor"], ada["subsystem_device"]) == (
        "10de",
        "26b1",
        "10de",
        "16a1",
    )
    assert (audio["device"], audio["iommu_group"]) == ("22ba", 32)
    others = {a: d for a, d in manifest["devices"].items() if not a.startswith("0000:d1:00.")}
    assert others == {a: d for a, d in reference["devices"].items() if not a.startswith("0000:d1:00.")}


# --- the tree -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, fakesys.Manifest]:
    out = tmp_path_factory.mktemp("reference") / "sys"
    return out, fakesys.write_tree(out, "reference")


GPU = "devices/pci0000:40/0000:40:01.1/0000:41:00.0"


def test_gpu_attributes_in_kernel_formats(reference_tree: tuple[Path, fakesys.Manifest]) -> None:
    sysfs, _ = reference_tree
    read = {
        name: (sysfs / GPU / name).read_text()
        for name in (
            "vendor",
            "device",
            "subsystem_vendor",
            "subsystem_device",
            "class",
            "revision",
            "numa_node",
            "local_cpulist",
            "current_link_speed",
            "current_link_width",
            "max_link_speed",
            "max_link_width",
            "boot_vga",
            "enable",
            "driver_override",
            "modalias",
        )
    }

    assert read == {
        "vendor": "0x10de\n",
        "device": "0x2bb1\n",
        "subsystem_vendor": "0x10de\n",
        "subsystem_device": "0x204b\n",
        "class": "0x030000\n",
        "revision": "0xa1\n",
        "numa_node": "0\n",
        "local_cpulist": "0-31,64-95\n",
        "current_link_speed": "32.0 GT/s PCIe\n",
        "current_link_width": "16\n",
        "max_link_speed": "32.0 GT/s PCIe\n",
        "max_link_width": "16\n",
        "boot_vga": "0\n",
        "enable": "1\n",
        "driver_override": "(null)\n",
        "modalias": "pci:v000010DEd00002BB1sv000010DEsd0000204Bbc03sc00i00\n",
    }


def test_resource_files(reference_tree: tuple[Path, fakesys.Manifest]) -> None:
    sysfs, _ = reference_tree
    zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"

    # Endpoint: 13 lines. BAR0 64 MiB 32-bit, BAR1 128 GiB and BAR3 32 MiB 64-bit prefetchable, BAR5 I/O, ROM.
    assert (sysfs / GPU / "resource").read_text() == (
        "0x000000008c000000 0x000000008fffffff 0x0000000000040200\n"
        "0x0000012000000000 0x0000013fffffffff 0x000000000014220c\n"
        + zero
        + "0x0000014000000000 0x0000014001ffffff 0x000000000014220c\n"
        + zero
        + "0x0000000000002000 0x000000000000207f 0x0000000000040101\n"
        "0x0000000090000000 0x000000009007ffff 0x0000000000046200\n" + zero * 6
    )
    # Bridge: 17 lines; the windows (I/O, memory, 64-bit prefetchable) span the card's resources.
    assert (sysfs / "devices/pci0000:40/0000:40:01.1/resource").read_text() == (
        zero * 13 + "0x0000000000002000 0x0000000000002fff 0x0000000000000101\n"
        "0x000000008c000000 0x00000000901fffff 0x0000000000000200\n"
        "0x0000012000000000 0x0000014001ffffff 0x0000000000102201\n" + zero
    )


def test_config_space_agrees_with_resource(reference_tree: tuple[Path, fakesys.Manifest]) -> None:
    """lspci reads the header from `config`: BARs, bus numbers and windows must say what `resource` says."""
    sysfs, _ = reference_tree
    gpu = (sysfs / GPU / "config").read_bytes()
    port = (sysfs / "devices/pci0000:40/0000:40:01.1/config").read_bytes()

    assert len(gpu) == len(port) == 64
    # ids, command (I/O + memory decoding, bus master), class, header type 0x80 (multifunction)
    assert struct.unpack_from("<HHH", gpu) == (0x10DE, 0x2BB1, 0x0007)
    assert (gpu[8], int.from_bytes(gpu[9:12], "little"), gpu[14]) == (0xA1, 0x030000, 0x80)
    assert struct.unpack_from("<6I", gpu, 0x10) == (0x8C000000, 0xC, 0x120, 0xC, 0x140, 0x2001)
    assert struct.unpack_from("<HHI", gpu, 0x2C) == (0x10DE, 0x204B, 0x90000000)  # ROM not enabled
    # A bridge (type 1, multifunction: the dummy host bridge shares its slot) with buses 40 -> 41..41,
    # I/O 0x2000-0x2fff, memory 0x8c000000-0x901fffff, 64-bit prefetchable 0x120_0000_0000-0x140_01ff_ffff.
    assert port[14] == 0x81
    assert tuple(port[0x18:0x1B]) == (0x40, 0x41, 0x41)
    assert tuple(port[0x1C:0x1E]) == (0x20, 0x20)
    assert struct.unpack_from("<HHHHII", port, 0x20) == (0x8C00, 0x9010, 0x0001, 0x01F1, 0x120, 0x140)


def test_links_are_relative_like_the_kernels(reference_tree: tuple[Path, fakesys.Manifest]) -> None:
    sysfs, _ = reference_tree

    assert os.readlink(sysfs / "bus/pci/devices/0000:41:00.0") == f"../../../{GPU}"
    assert os.readlink(sysfs / GPU / "iommu_group") == "../../../../kernel/iommu_groups/14"
    assert os.readlink(sysfs / GPU / "driver") == "../../../../bus/pci/drivers/nvidia"
    assert os.readlink(sysfs / "bus/pci/drivers/nvidia/0000:41:00.0") == f"../../../../{GPU}"
    assert sorted(os.listdir(sysfs / "kernel/iommu_groups/14/devices")) == ["0000:41:00.0", "0000:41:00.1"]
    assert os.readlink(sysfs / "kernel/iommu_groups/14/devices/0000:41:00.1") == (
        "../../../../devices/pci0000:40/0000:40:01.1/0000:41:00.1"
    )
    assert os.readlink(sysfs / "class/iommu/ivhd1") == "../../devices/pci0000:40/0000:40:00.2/iommu/ivhd1"
    assert sorted(os.listdir(sysfs / "class/iommu")) == [f"ivhd{n}" for n in range(10)]
    # Deeper functions get longer links: the BMC's VGA behind its PCIe-to-PCI bridge.
    assert os.readlink(sysfs / "devices/pci0000:00/0000:00:07.1/0000:04:00.0/0000:05:00.0/iommu_group") == (
        "../../../../../kernel/iommu_groups/11"
    )


def test_slots_bridges_and_groups(reference_tree: tuple[Path, fakesys.Manifest]) -> None:
    sysfs, manifest = reference_tree

    slots = {p.name: (p / "address").read_text() for p in (sysfs / "bus/pci/slots").iterdir()}
    assert slots == {
        "1": "0000:41:00\n",
        "2": "0000:51:00\n",
        "3": "0000:61:00\n",
        "4": "0000:71:00\n",
        "5": "0000:c1:00\n",
        "6": "0000:d1:00\n",
        "7": "0000:e1:00\n",
        "8": "0000:f1:00\n",
        "9": "0000:01:00\n",
    }
    port = sysfs / "devices/pci0000:40/0000:40:01.1"
    assert os.listdir(port / "pci_bus") == ["0000:41"]
    assert [(port / n).read_text() for n in ("secondary_bus_number", "subordinate_bus_number")] == [
        "65\n",
        "65\n",
    ]
    assert not (sysfs / "devices/pci0000:40/0000:40:00.2/iommu_group").exists()
    on_disk = {g.name: sorted(os.listdir(g / "devices")) for g in (sysfs / "kernel/iommu_groups").iterdir()}
    assert on_disk == manifest["groups"]
    assert (sysfs / "kernel/iommu_groups/0/type").read_text() == "DMA-FQ\n"


def test_the_fact_parser_reads_the_reference_bars(reference_tree: tuple[Path, fakesys.Manifest]) -> None:
    """pvegpu's PCI fact reads the BARs the generator wrote (the full read-back: test_facts_hardware)."""
    sysfs, _ = reference_tree
    hardware = read_hardware_locally(sysfs)
    gpu = hardware.by_address["0000:41:00.0"]
    assert [(b.index, b.size, b.is_64bit, b.prefetchable, b.is_io) for b in gpu.bars] == [
        (0, 64 << 20, False, False, False),
        (1, 128 << 30, True, True, False),
        (3, 32 << 20, True, True, False),
        (5, 128, False, False, True),
        (6, 512 << 10, False, True, False),
    ]


@pytest.mark.parametrize(
    ("driver", "gpu", "audio"),
    [("nvidia", "nvidia", "snd_hda_intel"), ("vfio-pci", "vfio-pci", "vfio-pci"), ("none", None, None)],
)
def test_driver_option_binds_the_cards_functions(
    tmp_path: Path, driver: str, gpu: str | None, audio: str | None
) -> None:
    manifest = fakesys.write_tree(tmp_path / "sys", "reference", driver=driver)

    def bound(address: str) -> str | None:
        link = tmp_path / "sys/bus/pci/devices" / address / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    assert [bound("0000:41:00.0"), bound("0000:41:00.1")] == [gpu, audio]
    assert [manifest["devices"][a]["driver"] for a in ("0000:41:00.0", "0000:41:00.1")] == [gpu, audio]
    assert bound("0000:01:00.0") == "mlx5_core"  # other devices keep their drivers
    assert manifest["driver"] == driver


def test_write_tree_refuses(tmp_path: Path) -> None:
    (tmp_path / "leftover").write_text("")
    with pytest.raises(
        ValueError, match=f"^{tmp_path} is not empty: refusing to write a sysfs tree over it$"
    ):
        fakesys.write_tree(tmp_path, "reference")
    with pytest.raises(ValueError, match=r"^unknown topology 'nope'; known: qemu-probe, reference, "):
        fakesys.write_tree(tmp_path / "a", "nope")
    with pytest.raises(ValueError, match=r"^unknown driver 'nouveau'; known: nvidia, vfio-pci, none$"):
        fakesys.write_tree(tmp_path / "b", "reference", driver="nouveau")


def test_cli_writes_tree_and_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        fakesys.main([str(tmp_path / "sys"), "--topology", "switches", "--json", str(tmp_path / "m.json")])
        == 0
    )
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(
        json.dumps(fakesys.manifest("switches"))
    )
    assert (tmp_path / "sys/bus/pci/slots/1/address").read_text() == "0000:43:00\n"

    assert fakesys.main(["--list"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == sorted(
        fakesys.TOPOLOGIES
    )
    assert fakesys.main([str(tmp_path / "sys"), "--topology", "switches"]) == 2
    assert "is not empty" in capsys.readouterr().err


# --- layout rules -------------------------------------------------------------------------------------------


def test_buses_are_numbered_depth_first_and_functions_listed_in_scan_order() -> None:
    port = qemu_root_port

    switch = Device(
        0,
        (
            Function(
                fn=0,
                vendor=0x104C,
                device=0x8232,
                class_code=0x060400,
                kind=Kind.UPSTREAM,
                children=(Device(0, (port(0, gpu_card()),)),),
            ),
        ),
    )
    box = Topology("t", "t", (RootComplex(0x10, 0, (Device(1, (port(0, switch), port(1, gpu_card()))),)),))

    assert [(p.address, p.secondary_bus, p.key) for p in place(box)] == [
        ("0000:10:01.0", 0x11, "pci0000:10/01.0"),
        ("0000:10:01.1", 0x14, "pci0000:10/01.1"),
        ("0000:11:00.0", 0x12, "pci0000:10/01.0/00.0"),
        ("0000:12:00.0", 0x13, "pci0000:10/01.0/00.0/00.0"),
        ("0000:13:00.0", None, "pci0000:10/01.0/00.0/00.0/00.0"),
        ("0000:13:00.1", None, "pci0000:10/01.0/00.0/00.0/00.1"),
        ("0000:14:00.0", None, "pci0000:10/01.1/00.0"),
        ("0000:14:00.1", None, "pci0000:10/01.1/00.1"),
    ]


def test_a_slot_without_function_0_is_refused() -> None:
    lone = Function(fn=1, vendor=0x1234, device=0x1111, class_code=0x038000, kind=Kind.ENDPOINT)
    box = Topology("t", "t", (RootComplex(0, 0, (Device(3, (lone,)),)),))

    with pytest.raises(
        TopologyError, match=r"^bus 0000:00 device 03: functions \[1\] \(function 0 is required"
    ):
        place(box)


def test_root_complexes_whose_buses_overlap_are_refused() -> None:
    port = Function(fn=0, vendor=0x1B36, device=0x000C, class_code=0x060400, kind=Kind.ROOT_PORT, acs=True)
    box = Topology(
        "t", "t", (RootComplex(0x10, 0, (Device(1, (port,)), Device(2, (port,)))), RootComplex(0x12, 0, ()))
    )

    with pytest.raises(TopologyError, match=r"^t: bus 0000:12 is below root buses 10 and 12$"):
        place(box)


# --- the kernel tier's QEMU side ----------------------------------------------------------------------------


def test_realize_stands_in_qemu_models() -> None:
    """A downstream port with ACS becomes a pcie-root-port under the upstream port; root ports get no I/O
    window; the GPU + audio card becomes bochs-display + ich9-intel-hda; q35's own functions are added."""
    down = Function(
        fn=0,
        vendor=0x1000,
        device=0xC010,
        class_code=0x060400,
        kind=Kind.DOWNSTREAM,
        acs=True,
        children=(gpu_card(),),
    )
    up = Function(
        fn=0,
        vendor=0x1000,
        device=0xC010,
        class_code=0x060400,
        kind=Kind.UPSTREAM,
        children=(Device(0, (down,)),),
    )
    rp = Function(
        fn=0,
        vendor=0x1022,
        device=0x14AB,
        class_code=0x060400,
        kind=Kind.ROOT_PORT,
        acs=True,
        children=(Device(0, (up,)),),
    )
    box = Topology("t", "t", (RootComplex(0x40, 0, (Device(1, (rp,)),)),))

    realization = realize(box, "intel")

    assert realization.args == (
        "-device",
        "intel-iommu,intremap=on",
        "-device",
        "pxb-pcie,id=pxb40,bus_nr=0x40,bus=pcie.0,addr=0x1",
        "-device",
        "pcie-root-port,id=d1,bus=pxb40,addr=0x1.0,chassis=1,slot=0,io-reserve=0",
        "-device",
        "x3130-upstream,id=d2,bus=d1,addr=0x0.0",
        "-device",
        "pcie-root-port,id=d3,bus=d2,addr=0x0.0,chassis=2,slot=0,io-reserve=0",
        "-device",
        "bochs-display,id=d4,bus=d3,addr=0x0.0,multifunction=on,romfile=",
        "-device",
        "ich9-intel-hda,id=d5,bus=d3,addr=0x0.1",
    )
    placed = place(realization.topology)
    assert [(p.address, f"{p.function.vendor:04x}:{p.function.device:04x}") for p in placed] == [
        ("0000:00:00.0", "8086:29c0"),
        ("0000:00:01.0", "1b36:000b"),
        ("0000:00:1f.0", "8086:2918"),
        ("0000:00:1f.2", "8086:2922"),
        ("0000:00:1f.3", "8086:2930"),
        ("0000:40:01.0", "1b36:000c"),
        ("0000:41:00.0", "104c:8232"),
        ("0000:42:00.0", "1b36:000c"),
        ("0000:43:00.0", "1234:1111"),
        ("0000:43:00.1", "8086:293e"),
    ]
    assert partition(iommu_groups(placed)) == {
        frozenset({"0000:00:00.0"}),
        frozenset({"0000:00:01.0"}),
        frozenset({"0000:00:1f.0", "0000:00:1f.2", "0000:00:1f.3"}),
        frozenset({"0000:40:01.0"}),
        frozenset({"0000:41:00.0"}),
        frozenset({"0000:42:00.0"}),
        frozenset({"0000:43:00.0", "0000:43:00.1"}),
    }


def test_realize_refuses_what_q35_owns() -> None:
    chipset = Function(fn=0, vendor=0x1234, device=0x11E8, class_code=0x00FF00, kind=Kind.ENDPOINT)
    box = Topology("t", "t", (RootComplex(0, 0, (Device(0x1F, (chipset,)),)),))

    with pytest.raises(TopologyError, match=r"^t: 00:00 and 00:1f belong to q35's host bridge and ICH9$"):
        realize(box)


def test_parse_probe_needs_a_complete_report() -> None:
    line = (
        "PCI 0000:00:00.0 vendor=0x8086 device=0x29c0 class=0x060000 group=0 "
        "path=devices/pci0000:00/0000:00:00.0"
    )

    assert parse_probe(f"noise\r\n=== BEGIN uptime=1\r\n{line}\r\n=== END uptime=2\r\n")[0].group == 0
    with pytest.raises(ValueError, match=r"^no complete '=== BEGIN' \.\.\. '=== END' report"):
        parse_probe(f"=== BEGIN uptime=1\n{line}\n")
    with pytest.raises(ValueError, match=r"^unparsable PCI line: 'PCI 0000:00:00.0 vendor=0x8086'$"):
        parse_probe("=== BEGIN\nPCI 0000:00:00.0 vendor=0x8086\n=== END\n")
