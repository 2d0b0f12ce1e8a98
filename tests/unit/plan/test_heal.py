"""`plan_heal`: the node's mappings after a BIOS change, decided per GPU, on the lab's generated trees
(lab.fakesys, synthetic boxes) and on small edits of their mappings. The repaired sections must pass
Proxmox's own check (tests/unit/proxmox_mapping_check.py) on the tree they were computed from.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import PciMapping
from pvegpu.plan.heal import HealPlan, Health, Status, plan_heal
from pvegpu.plan.mapping import plan_mappings
from pvegpu.plan.topology import plan_vendor_topology
from tests.unit.proxmox_mapping_check import check_node

NAMES = (
    "reference",
    "reference-renumbered",
    "reference-missing-gpu",
    "reference-other-card",
    "shared-with-nic",
)
PVE2_GUI = "path=0000:21:00,node=pve2,id=10de:2bb1,subsystem-id=10de:204b,iommugroup=16"


@pytest.fixture(scope="module")
def hw(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HostHardware]:
    root = tmp_path_factory.mktemp("sys")
    for name in NAMES:
        write_tree(root / name, name)
    return {name: read_hardware_locally(root / name) for name in NAMES}


def mapped(hw: HostHardware) -> tuple[PciMapping, ...]:
    """The sections `pvegpu mapping` writes for node pve1 on `hw`."""
    return plan_mappings({"pve1": plan_vendor_topology(hw, "10de")})


def with_pve2(sections: tuple[PciMapping, ...]) -> tuple[PciMapping, ...]:
    """Each section with a pve2 line (GUI key order) before pve1's, as a cluster's pci.cfg may hold it."""
    return tuple(replace(s, map=(PVE2_GUI, *s.map)) for s in sections)


def statuses(plan: HealPlan) -> list[str]:
    return [gpu.status.value for gpu in plan.gpus]


RENUMBERED = [
    "gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16, repaired",
    "gpu1 pve1: 0000:51:00 group 17 -> 0000:31:00 group 19, repaired",
    "gpu2 pve1: 0000:61:00 group 20 -> 0000:41:00 group 22, repaired",
    "gpu3 pve1: 0000:71:00 group 23 -> 0000:51:00 group 25, repaired",
    "gpu4 pve1: 0000:c1:00 group 29 -> 0000:a1:00 group 31, repaired",
    "gpu5 pve1: 0000:d1:00 group 32 -> 0000:b1:00 group 34, repaired",
    "gpu6 pve1: 0000:e1:00 group 35 -> 0000:c1:00 group 37, repaired",
    "gpu7 pve1: 0000:f1:00 group 38 -> 0000:d1:00 group 40, repaired",
]
MISSING = "7 GPUs found for 8 mappings of pve1: a card is missing"
NIC = (
    "IOMMU group 21 also holds 0000:74:00.0 (Ethernet controller [0200] 15b3:101d); "
    "pass the whole group or move the card"
)
CHANGED = "is a renumbering, but another GPU of pve1 changed, not repaired"

CASES = [
    ("reference", True, [f"gpu{n} pve1: unchanged" for n in range(8)]),
    ("reference-renumbered", True, RENUMBERED),
    (
        "reference-missing-gpu",
        False,
        [
            "gpu0 pve1: unchanged",
            "gpu1 pve1: unchanged",
            "gpu2 pve1: unchanged",
            f"gpu3 pve1: 0000:71:00 group 23: no device there now; {MISSING}, not repaired",
            f"gpu4 pve1: 0000:c1:00 group 29 -> group 28; {MISSING}, not repaired",
            f"gpu5 pve1: 0000:d1:00 group 32 -> group 31; {MISSING}, not repaired",
            f"gpu6 pve1: 0000:e1:00 group 35 -> group 34; {MISSING}, not repaired",
            f"gpu7 pve1: 0000:f1:00 group 38 -> group 37; {MISSING}, not repaired",
        ],
    ),
    (
        "reference-other-card",
        False,
        [
            *(f"gpu{n} pve1: unchanged" for n in range(5)),
            "gpu5 pve1: slot 6 held 10de:2bb1 subsystem 10de:204b at 0000:d1:00, now 10de:26b1 subsystem "
            "10de:16a1 at 0000:d1:00: another model, not repaired",
            "gpu6 pve1: unchanged",
            "gpu7 pve1: unchanged",
        ],
    ),
    (
        "shared-with-nic",
        False,
        [
            "gpu0 pve1: unchanged",
            "gpu1 pve1: unchanged",
            "gpu2 pve1: unchanged",
            f"gpu3 pve1: 0000:71:00 group 23 -> 0000:73:00: {NIC}, not repaired",
            f"gpu4 pve1: 0000:c1:00 group 29 -> 0000:c1:00 group 27 {CHANGED}",
            f"gpu5 pve1: 0000:d1:00 group 32 -> 0000:d1:00 group 30 {CHANGED}",
            f"gpu6 pve1: 0000:e1:00 group 35 -> 0000:e1:00 group 33 {CHANGED}",
            f"gpu7 pve1: 0000:f1:00 group 38 -> 0000:f1:00 group 36 {CHANGED}",
        ],
    ),
]


HEALTH = {
    "reference": Health.VALID,
    "reference-renumbered": Health.DRIFT,
    "reference-missing-gpu": Health.CHANGED,
    "reference-other-card": Health.CHANGED,
    "shared-with-nic": Health.CHANGED,
}


@pytest.mark.parametrize(("live", "ok", "lines"), CASES, ids=[case[0] for case in CASES])
def test_reference_mappings_on_each_lab_box(
    hw: dict[str, HostHardware], live: str, ok: bool, lines: list[str]
) -> None:
    sections = with_pve2(mapped(hw["reference"]))

    plan = plan_heal("pve1", sections, hw[live])

    assert (plan.ok, list(plan.lines), plan.added, plan.health) == (ok, lines, (), HEALTH[live])
    # pve2's line: byte for byte, in its place, whatever happened to pve1's.
    assert [s.map[0] for s in plan.sections] == [PVE2_GUI] * 8
    if not ok:
        assert plan.sections == sections  # nothing of a node with a refused GPU is repaired


def test_bios_renumbered_repair_passes_proxmox_check(hw: dict[str, HostHardware]) -> None:
    before = mapped(hw["reference"])
    assert [check_node(m, "pve1", hw["reference-renumbered"]) != () for m in before] == [True] * 8

    plan = plan_heal("pve1", before, hw["reference-renumbered"])

    assert statuses(plan) == ["repaired"] * 8
    assert plan.sections == mapped(hw["reference-renumbered"])
    assert [check_node(m, "pve1", hw["reference-renumbered"]) for m in plan.sections] == [()] * 8
    assert plan_heal("pve1", plan.sections, hw["reference-renumbered"]).lines == tuple(
        f"gpu{n} pve1: unchanged" for n in range(8)
    )


def test_added_card_refuses_and_names_it(hw: dict[str, HostHardware]) -> None:
    plan = plan_heal("pve1", mapped(hw["reference-missing-gpu"]), hw["reference"])
    added = "8 GPUs found for 7 mappings of pve1: a card is added"

    assert (plan.ok, statuses(plan)) == (False, ["unchanged"] * 3 + ["refused"] * 4)
    assert plan.lines[3] == f"gpu3 pve1: 0000:c1:00 group 28 -> group 29; {added}, not repaired"
    assert plan.added == tuple(
        f"{address} group {group} (10de:2bb1 subsystem 10de:204b, slot {slot}) is a GPU no mapping names; "
        f"{added}"
        for address, group, slot in (
            ("0000:71:00", 23, 4),
            ("0000:c1:00", 29, 5),
            ("0000:d1:00", 32, 6),
            ("0000:e1:00", 35, 7),
            ("0000:f1:00", 38, 8),
        )
    )
    assert plan.lines[-1] == f"pve1: {plan.added[-1]}, not repaired"


def test_cards_in_another_order_are_refused_not_swapped(hw: dict[str, HostHardware]) -> None:
    """gpu0's line describes the card now first in order, gpu1's the one now second: each still holds its
    card exactly, at another index, so the cards around them moved."""
    sections = list(mapped(hw["reference"]))
    sections[0], sections[1] = replace(sections[1], id="gpu0"), replace(sections[0], id="gpu1")

    plan = plan_heal("pve1", sections, hw["reference"])

    assert plan.lines[:3] == (
        "gpu0 pve1: 0000:51:00 group 17 still holds its card, but that card is now GPU 1 in physical order, "
        "not 0: a card was added, removed or moved, not repaired",
        "gpu1 pve1: 0000:41:00 group 14 still holds its card, but that card is now GPU 0 in physical order, "
        "not 1: a card was added, removed or moved, not repaired",
        "gpu2 pve1: unchanged",
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "id=10de:2bb1,node=pve1,path=0000:41:01,iommugroup=14,subsystem-id=10de:204b",
            "gpu0 pve1: 0000:41:01 group 14 -> 0000:21:00: another device number in its slot path, so not "
            "the same position: the card moved, not repaired",
        ),
        (
            "id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:1234",
            "gpu0 pve1: slot 1 held 10de:2bb1 subsystem 10de:1234 at 0000:41:00, now 10de:2bb1 subsystem "
            "10de:204b at 0000:21:00: another card of the model, not repaired",
        ),
        (
            "id=10de:2bb1,node=pve1,path=0000:41:00;0000:51:00,iommugroup=14,subsystem-id=10de:204b",
            "gpu0 pve1: path 0000:41:00;0000:51:00 names 2 devices passed together: pvegpu writes one, "
            "not repaired",
        ),
    ],
)
def test_error_gpu0_line_not_a_renumbering(hw: dict[str, HostHardware], line: str, expected: str) -> None:
    sections = list(mapped(hw["reference"]))
    sections[0] = replace(sections[0], map=(line,))

    plan = plan_heal("pve1", sections, hw["reference-renumbered"])

    assert plan.lines[0] == expected
    assert statuses(plan)[1:] == ["refused"] * 7  # held: nothing of the node is repaired
    assert plan.sections == tuple(sections)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ((PVE2_GUI,), "gpu0 pve1: no map line for pve1: pvegpu writes one, not repaired"),
        (
            (PVE2_GUI.replace("pve2", "pve1"), PVE2_GUI.replace("pve2", "pve1")),
            "gpu0 pve1: 2 map lines for pve1: pvegpu writes one, not repaired",
        ),
    ],
)
def test_error_not_one_line_for_the_node(
    hw: dict[str, HostHardware], lines: tuple[str, ...], expected: str
) -> None:
    sections = list(mapped(hw["reference"]))
    sections[0] = replace(sections[0], map=lines)

    plan = plan_heal("pve1", sections, hw["reference"])

    assert plan.lines[0] == expected
    assert plan.lines[1] == "gpu1 pve1: unchanged"
    assert not plan.ok


def test_repair_keeps_description_and_path_shape_and_writes_canonical_order(
    hw: dict[str, HostHardware],
) -> None:
    gui = "path=0000:41:00.0,node=pve1,id=10DE:2BB1,subsystem-id=10de:204b,iommugroup=14,description=top"
    sections = list(mapped(hw["reference"]))
    sections[0] = replace(sections[0], map=(gui,), description="mine")

    plan = plan_heal("pve1", sections, hw["reference-renumbered"])

    assert plan.gpus[0].status is Status.REPAIRED
    assert plan.sections[0] == PciMapping(
        id="gpu0",
        map=(
            "id=10de:2bb1,node=pve1,path=0000:21:00.0,description=top,iommugroup=16,subsystem-id=10de:204b",
        ),
        description="mine",
    )


def test_sections_outside_the_scheme_are_kept_and_not_decided(hw: dict[str, HostHardware]) -> None:
    other = PciMapping(id="nic0", map=("id=15b3:101d,node=pve1,path=0000:01:00.0,iommugroup=8",))
    sections = (other, *(replace(s, id=s.id.replace("gpu", "rtx")) for s in mapped(hw["reference"])))

    plan = plan_heal("pve1", sections, hw["reference-renumbered"], prefix="rtx")

    assert [gpu.mapping for gpu in plan.gpus] == [f"rtx{n}" for n in range(8)]
    assert statuses(plan) == ["repaired"] * 8
    assert plan.sections[0] is other


def test_noop_no_managed_mapping_decides_nothing(hw: dict[str, HostHardware]) -> None:
    plan = plan_heal("pve1", (), hw["reference"])

    assert (plan.ok, plan.gpus, plan.added, plan.sections) == (True, (), (), ())


def test_findings_say_what_is_without_what_is_done(hw: dict[str, HostHardware]) -> None:
    """The doctor's lines: the same decisions, reported, never carried out."""
    sections = mapped(hw["reference"])

    renumbered = plan_heal("pve1", sections, hw["reference-renumbered"])
    missing = plan_heal("pve1", mapped(hw["reference-missing-gpu"]), hw["reference"])

    assert plan_heal("pve1", sections, hw["reference"]).findings[0] == "gpu0 pve1: valid"
    assert renumbered.findings[0] == "gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16 (renumbered)"
    assert missing.findings[3] == (
        "gpu3 pve1: 0000:c1:00 group 28 -> group 29; 8 GPUs found for 7 mappings of pve1: a card is added"
    )
    assert missing.findings[-1] == f"pve1: {missing.added[-1]}"
