"""The topology planner: GPU selection, cards, group verdicts, stable names.

Synthesized HostHardware (built below, shaped like a 2-socket EPYC box with one GPU per root complex)
covers each rule; the real captured listings of tests/unit/realdata.py cover real group layouts.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pvegpu.models.hardware import Bar, HostHardware, Link, PciFunction
from pvegpu.models.node import GpuSelector
from pvegpu.plan.topology import (
    IOMMU_OFF,
    ORDER_BY_BUS,
    ORDER_BY_SLOT,
    Topology,
    Verdict,
    class_name,
    display_ids,
    plan_topology,
    plan_vendor_topology,
    topology_to_json,
)
from tests.unit import realdata

RTX_PRO_6000 = GpuSelector(ids=("10de:2bb1",))


def fn(
    address: str,
    *,
    cls: int,
    ids: str,
    group: int | None,
    root_bus: str,
    numa: int | None = 0,
    slot: str | None = None,
    subsystem: str = "10de:204b",
) -> PciFunction:
    vendor, device = ids.split(":")
    sub_vendor, sub_device = subsystem.split(":")
    return PciFunction(
        address=address,
        vendor=vendor,
        device=device,
        subsystem_vendor=sub_vendor,
        subsystem_device=sub_device,
        class_code=cls,
        driver=None,
        iommu_group=group,
        numa_node=numa,
        root_bus=root_bus,
        physical_slot=slot,
    )


def card(
    bus: int, root: int, group: int | None, numa: int | None, *, slot: str | None = None, marker: int = 0
) -> list[PciFunction]:
    """Root port root:01.1 (own group), GPU bus:00.0 and HDMI audio bus:00.1 sharing `group`.

    `marker` goes into the subsystem device id so a test can follow one physical card across renumbering.
    """
    root_bus = f"0000:{root:02x}"
    sub = f"10de:{marker:04x}"
    return [
        fn(f"{root_bus}:01.1", cls=0x060400, ids="1022:149a", group=None if group is None else group + 100,
           root_bus=root_bus, numa=numa, subsystem="0000:0000"),
        fn(f"0000:{bus:02x}:00.0", cls=0x030000, ids="10de:2bb1", group=group, root_bus=root_bus, numa=numa,
           slot=slot, subsystem=sub),
        fn(f"0000:{bus:02x}:00.1", cls=0x040300, ids="10de:22e8", group=group, root_bus=root_bus, numa=numa,
           slot=slot, subsystem=sub),
    ]  # fmt: skip


def host(*functions: PciFunction | list[PciFunction], iommu: bool = True) -> HostHardware:
    flat: list[PciFunction] = []
    for item in functions:
        flat.extend(item if isinstance(item, list) else [item])
    return HostHardware(functions=tuple(flat), iommu_present=iommu)


# Physical position p (0-7) sits on root complex p*0x20; positions 0-3 on socket 0, 4-7 on socket 1.
REFERENCE = host(*(card(p * 0x20 + 1, p * 0x20, group=10 + p, numa=p // 4, marker=p) for p in range(8)))


def verdicts(topology: Topology) -> list[tuple[str, str, Verdict, str | None]]:
    return [(gpu.name, gpu.address, gpu.verdict, gpu.reason) for gpu in topology.gpus]


def test_reference_eight_passable_cards_in_physical_order() -> None:
    topology = plan_topology(REFERENCE, RTX_PRO_6000)
    assert topology.ok
    assert topology.problems == ()
    assert topology.order_key == ORDER_BY_BUS
    rows = [(g.name, g.address, g.functions, g.iommu_group, g.root_bus, g.numa_node) for g in topology.gpus]
    assert rows[0] == ("gpu0", "0000:01:00", ("0000:01:00.0", "0000:01:00.1"), 10, "0000:00", 0)
    assert rows[7] == ("gpu7", "0000:e1:00", ("0000:e1:00.0", "0000:e1:00.1"), 17, "0000:e0", 1)
    assert [row[1] for row in rows] == [f"0000:{p * 0x20 + 1:02x}:00" for p in range(8)]
    assert [(row[3], row[5]) for row in rows] == [(10 + p, p // 4) for p in range(8)]
    assert {gpu.verdict for gpu in topology.gpus} == {Verdict.PASSABLE}


def test_bios_renumbered_keeps_every_name_on_its_card() -> None:
    """Same eight cards; firmware moved every secondary bus and renumbered every group in reverse."""
    renumbered = host(*(card(p * 0x20 + 3, p * 0x20, group=90 - p, numa=p // 4, marker=p) for p in range(8)))
    before = {gpu.name: gpu.subsystem_id for gpu in plan_topology(REFERENCE, RTX_PRO_6000).gpus}
    after = plan_topology(renumbered, RTX_PRO_6000)
    assert {gpu.name: gpu.subsystem_id for gpu in after.gpus} == before
    assert [gpu.iommu_group for gpu in after.gpus] == [90, 89, 88, 87, 86, 85, 84, 83]
    assert after.gpus[0].address == "0000:03:00"


def test_numa_node_comes_before_root_bus() -> None:
    """Socket 1's root complexes enumerated first (low bus numbers): socket 0's cards are still gpu0, gpu1."""
    hw = host(card(0x01, 0x00, 1, numa=1, marker=10), card(0x41, 0x40, 2, numa=0, marker=0),
              card(0x81, 0x80, 3, numa=0, marker=1), card(0xC1, 0xC0, 4, numa=1, marker=11))  # fmt: skip
    assert [gpu.subsystem_id for gpu in plan_topology(hw, RTX_PRO_6000).gpus] == [
        "10de:0000",
        "10de:0001",
        "10de:000a",
        "10de:000b",
    ]


def test_unknown_numa_node_sorts_last() -> None:
    hw = host(card(0x01, 0x00, 1, numa=None, marker=9), card(0x41, 0x40, 2, numa=1, marker=0))
    assert [gpu.address for gpu in plan_topology(hw, RTX_PRO_6000).gpus] == ["0000:41:00", "0000:01:00"]


def test_physical_slots_order_cards_when_every_card_has_one() -> None:
    """Slot "2" before "10" (not text order), whatever the buses say."""
    hw = host(
        card(0x01, 0x00, 1, 0, slot="10"), card(0x41, 0x40, 2, 0, slot="2"), card(0x81, 0x80, 3, 0, slot="7")
    )
    topology = plan_topology(hw, RTX_PRO_6000)
    assert topology.order_key == ORDER_BY_SLOT
    assert [(gpu.name, gpu.address, gpu.physical_slot) for gpu in topology.gpus] == [
        ("gpu0", "0000:41:00", "2"),
        ("gpu1", "0000:81:00", "7"),
        ("gpu2", "0000:01:00", "10"),
    ]


@pytest.mark.parametrize(
    "slots", [pytest.param(("1", None), id="one-missing"), pytest.param(("1", "1"), id="duplicate")]
)
def test_slots_missing_or_duplicated_fall_back_to_bus_order(slots: tuple[str | None, str | None]) -> None:
    hw = host(card(0x41, 0x40, 2, 0, slot=slots[0]), card(0x01, 0x00, 1, 0, slot=slots[1]))
    topology = plan_topology(hw, RTX_PRO_6000)
    assert topology.order_key == ORDER_BY_BUS
    assert [gpu.address for gpu in topology.gpus] == ["0000:01:00", "0000:41:00"]


def test_error_nic_in_gpu_group_refuses_the_card_naming_the_nic() -> None:
    nic = fn(
        "0000:43:00.0", cls=0x020000, ids="8086:1592", group=23, root_bus="0000:40", subsystem="8086:0002"
    )
    hw = host(card(0x01, 0x00, 10, 0), card(0x41, 0x40, 23, 0), nic)
    assert verdicts(plan_topology(hw, RTX_PRO_6000)) == [
        ("gpu0", "0000:01:00", Verdict.PASSABLE, None),
        ("gpu1", "0000:41:00", Verdict.REFUSED,
         "IOMMU group 23 also holds 0000:43:00.0 (Ethernet controller [0200] 8086:1592); "
         "pass the whole group or move the card"),
    ]  # fmt: skip
    assert not plan_topology(hw, RTX_PRO_6000).ok


def test_error_offenders_in_two_groups_are_all_named() -> None:
    """GPU function and audio function in separate groups, each shared with an endpoint."""
    gpu, audio = card(0x41, 0x40, 5, 0)[1:]
    hw = host(
        gpu,
        replace(audio, iommu_group=6),
        fn("0000:44:00.0", cls=0x010802, ids="144d:a80a", group=6, root_bus="0000:40"),
        fn("0000:43:00.1", cls=0x0C0330, ids="1022:15b6", group=5, root_bus="0000:40"),
        fn("0000:43:00.0", cls=0x020000, ids="8086:1592", group=5, root_bus="0000:40"),
    )
    [refused] = plan_topology(hw, RTX_PRO_6000).gpus
    assert refused.reason == (
        "IOMMU group 5 also holds 0000:43:00.0 (Ethernet controller [0200] 8086:1592), "
        "0000:43:00.1 (USB controller [0c03] 1022:15b6); "
        "IOMMU group 6 also holds 0000:44:00.0 (Non-Volatile memory controller [0108] 144d:a80a); "
        "pass the whole groups or move the card"
    )


def test_bridges_in_the_group_are_tolerated_other_bridge_classes_are_not() -> None:
    gpu, audio = card(0x41, 0x40, 7, 0)[1:]
    tolerated = host(
        gpu,
        audio,
        fn("0000:40:01.1", cls=0x060400, ids="1022:149a", group=7, root_bus="0000:40"),
        fn("0000:40:00.0", cls=0x060000, ids="1022:149f", group=7, root_bus="0000:40"),
    )
    assert verdicts(plan_topology(tolerated, RTX_PRO_6000)) == [
        ("gpu0", "0000:41:00", Verdict.PASSABLE, None)
    ]
    isa = host(gpu, audio, fn("0000:40:1f.0", cls=0x060100, ids="8086:a2c9", group=7, root_bus="0000:40"))
    assert plan_topology(isa, RTX_PRO_6000).gpus[0].reason == (
        "IOMMU group 7 also holds 0000:40:1f.0 (ISA bridge [0601] 8086:a2c9); "
        "pass the whole group or move the card"
    )


def test_error_unselected_gpu_in_the_group_is_an_offender() -> None:
    gpu, audio = card(0x41, 0x40, 7, 0)[1:]
    other = fn(
        "0000:42:00.0", cls=0x030200, ids="10de:2331", group=7, root_bus="0000:40", subsystem="10de:1626"
    )
    topology = plan_topology(host(gpu, audio, other), RTX_PRO_6000)
    assert [gpu.address for gpu in topology.gpus] == ["0000:41:00"]
    assert topology.gpus[0].reason == (
        "IOMMU group 7 also holds 0000:42:00.0 (3D controller [0302] 10de:2331); "
        "pass the whole group or move the card"
    )


def test_error_iommu_off_refuses_every_card() -> None:
    hw = host(card(0x01, 0x00, None, 0), card(0x41, 0x40, None, 0), iommu=False)
    assert verdicts(plan_topology(hw, RTX_PRO_6000)) == [
        ("gpu0", "0000:01:00", Verdict.REFUSED, IOMMU_OFF),
        ("gpu1", "0000:41:00", Verdict.REFUSED, IOMMU_OFF),
    ]
    assert IOMMU_OFF == (
        "no IOMMU group: the IOMMU is off "
        "(enable AMD-Vi/VT-d in firmware and the IOMMU in the kernel cmdline)"
    )


def test_error_function_without_group_while_iommu_is_on() -> None:
    hw = host(card(0x41, 0x40, None, 0))
    assert verdicts(plan_topology(hw, RTX_PRO_6000)) == [
        ("gpu0", "0000:41:00", Verdict.REFUSED,
         "no IOMMU group for 0000:41:00.0, 0000:41:00.1 although an IOMMU is active"),
    ]  # fmt: skip


def test_error_count_mismatch_is_a_problem_not_a_crash() -> None:
    topology = plan_topology(REFERENCE, GpuSelector(ids=("10de:2bb1", "10de:2bb5"), count=7))
    assert topology.problems == ("expected 7 GPUs with id 10de:2bb1, 10de:2bb5, found 8",)
    assert len(topology.gpus) == 8
    assert not topology.ok
    assert plan_topology(REFERENCE, GpuSelector(ids=("10de:2bb1",), count=8)).ok


def test_error_nothing_selected_is_a_problem() -> None:
    """The audio function's id is listed, but only display functions are GPUs."""
    topology = plan_topology(REFERENCE, GpuSelector(ids=("10de:22e8",)))
    assert (topology.gpus, topology.problems, topology.ok) == (
        (),
        ("no display function has id 10de:22e8",),
        False,
    )


def test_card_carries_what_the_mapping_planner_needs() -> None:
    link = Link(current_speed_gts=32.0, current_width=16, max_speed_gts=32.0, max_width=16)
    bars = (Bar(index=1, start=0x18000000000, size=1 << 37, is_64bit=True, prefetchable=True, is_io=False),)
    gpu, audio = card(0x41, 0x40, 17, 0, slot="3")[1:]
    [result] = plan_topology(host(replace(gpu, link=link, bars=bars), audio), RTX_PRO_6000).gpus
    assert (result.gpu_function, result.link, result.bars, result.physical_slot, result.id) == (
        "0000:41:00.0",
        link,
        bars,
        "3",
        "10de:2bb1",
    )


def test_topology_json_shape() -> None:
    nic = fn("0000:43:00.0", cls=0x020000, ids="8086:1592", group=11, root_bus="0000:20")
    topology = plan_topology(host(card(0x01, 0x00, 10, 0), card(0x21, 0x20, 11, None), nic), RTX_PRO_6000)
    assert topology_to_json(topology) == {
        "gpus": [
            {"name": "gpu0", "address": "0000:01:00", "functions": ["0000:01:00.0", "0000:01:00.1"],
             "id": "10de:2bb1", "subsystem_id": "10de:0000", "iommu_group": 10, "root_bus": "0000:00",
             "numa_node": 0, "verdict": "passable", "reason": None},
            {"name": "gpu1", "address": "0000:21:00", "functions": ["0000:21:00.0", "0000:21:00.1"],
             "id": "10de:2bb1", "subsystem_id": "10de:0000", "iommu_group": 11, "root_bus": "0000:20",
             "numa_node": None, "verdict": "refused",
             "reason": "IOMMU group 11 also holds 0000:43:00.0 (Ethernet controller [0200] 8086:1592); "
                       "pass the whole group or move the card"},
        ],
        "order_key": "numa node, root bus, bus address",
        "problems": [],
    }  # fmt: skip


def test_display_ids_lists_a_vendors_display_functions() -> None:
    other = fn("0000:c1:00.0", cls=0x030200, ids="10de:2331", group=50, root_bus="0000:c0")
    amd = fn("0000:e1:00.0", cls=0x038000, ids="1002:74a1", group=51, root_bus="0000:e0")
    assert display_ids(host(card(0x01, 0x00, 1, 0), other, amd), "10de") == ("10de:2331", "10de:2bb1")


def test_vendor_topology_selects_every_model_of_the_vendor() -> None:
    h100 = fn("0000:f1:00.0", cls=0x030200, ids="10de:2331", group=50, root_bus="0000:f0", numa=1)
    topology = plan_vendor_topology(host(card(0x01, 0x00, 1, 0), h100), "10de", count=2)
    assert ([gpu.id for gpu in topology.gpus], topology.ok) == (["10de:2bb1", "10de:2331"], True)


@pytest.mark.parametrize(
    ("count", "problem"),
    [(None, "no display function of vendor 1002"), (4, "expected 4 GPUs of vendor 1002, found 0")],
)
def test_error_vendor_topology_without_such_gpus(count: int | None, problem: str) -> None:
    topology = plan_vendor_topology(REFERENCE, "1002", count)
    assert (topology.gpus, topology.order_key, topology.problems) == ((), ORDER_BY_BUS, (problem,))


def test_class_name_falls_back_like_lspci() -> None:
    assert (class_name(0x0200), class_name(0x0D11)) == ("Ethernet controller", "Class 0d11")


def test_five_digit_domain_sorts_after_domain_0000() -> None:
    """VMD puts devices in domains like 10000; text order would put them first."""
    vmd = [replace(f, address="1" + f.address, root_bus="10000:e0") for f in card(0xE1, 0xE0, 9, 0)]
    topology = plan_topology(host(vmd, card(0x41, 0x40, 2, 0)), RTX_PRO_6000)
    assert [gpu.address for gpu in topology.gpus] == ["0000:41:00", "10000:e1:00"]


# Real captured listings (sources in realdata.py).


def test_real_v100_gpus_sharing_groups_refuse_each_other() -> None:
    topology = plan_topology(realdata.v100_shared_groups(), GpuSelector(ids=("10de:1db4",), count=6))
    shared = "also holds {} (3D controller [0302] 10de:1db4); pass the whole group or move the card"
    assert topology.problems == ()
    assert verdicts(topology) == [
        ("gpu0", "0000:27:00", Verdict.REFUSED, "IOMMU group 19 " + shared.format("0000:28:00.0")),
        ("gpu1", "0000:28:00", Verdict.REFUSED, "IOMMU group 19 " + shared.format("0000:27:00.0")),
        ("gpu2", "0000:44:00", Verdict.PASSABLE, None),
        ("gpu3", "0000:a3:00", Verdict.PASSABLE, None),
        ("gpu4", "0000:c3:00", Verdict.REFUSED, "IOMMU group 87 " + shared.format("0000:c4:00.0")),
        ("gpu5", "0000:c4:00", Verdict.REFUSED, "IOMMU group 87 " + shared.format("0000:c3:00.0")),
    ]


def test_real_desktop_gpu_sharing_group_with_its_root_port_is_passable() -> None:
    hw = realdata.desktop_gt1030_with_rootport()
    assert [f.address for f in hw.group_members(2)] == ["0000:00:01.0", "0000:01:00.0", "0000:01:00.1"]
    assert display_ids(hw, "10de") == ("10de:1d01",)
    [gpu] = plan_topology(hw, GpuSelector(ids=("10de:1d01",))).gpus
    assert (gpu.name, gpu.functions, gpu.iommu_group, gpu.verdict) == (
        "gpu0",
        ("0000:01:00.0", "0000:01:00.1"),
        2,
        Verdict.PASSABLE,
    )


def test_real_desktop_igpu_and_dgpu_selected_together() -> None:
    topology = plan_topology(
        realdata.desktop_gt1030_with_rootport(), GpuSelector(ids=("10de:1d01", "8086:3e92"))
    )
    assert verdicts(topology) == [
        ("gpu0", "0000:00:02", Verdict.PASSABLE, None),
        ("gpu1", "0000:01:00", Verdict.PASSABLE, None),
    ]


def test_real_rtx4000_numa_node_from_function_0() -> None:
    [gpu] = plan_topology(realdata.rtx4000_sff_numa1(), GpuSelector(ids=("10de:27b0",))).gpus
    assert (gpu.address, gpu.functions, gpu.subsystem_id, gpu.iommu_group, gpu.numa_node, gpu.verdict) == (
        "0000:01:00",
        ("0000:01:00.0", "0000:01:00.1"),
        "10de:16fa",
        13,
        1,
        Verdict.PASSABLE,
    )
