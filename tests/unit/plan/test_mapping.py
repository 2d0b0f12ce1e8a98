"""plan_mappings and diff_mappings on the lab's synthetic boxes (lab.fakesys trees, read with the real fact
command): names follow the physical order, one map line per node, refusals and disagreements named.
"""

from __future__ import annotations

import dataclasses

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.hardware import HostHardware
from pvegpu.models.node import GpuSelector
from pvegpu.models.pve import PciMapping
from pvegpu.plan.mapping import (
    Action,
    MappingChange,
    MappingPlanError,
    diff_mappings,
    managed_index,
    mapping_id,
    plan_mappings,
    with_path_shape,
)
from pvegpu.plan.topology import Topology, plan_topology

RTX = GpuSelector(ids=("10de:2bb1",))
REFERENCE_SLOTS = [
    ("0000:41:00", 14),
    ("0000:51:00", 17),
    ("0000:61:00", 20),
    ("0000:71:00", 23),
    ("0000:c1:00", 29),
    ("0000:d1:00", 32),
    ("0000:e1:00", 35),
    ("0000:f1:00", 38),
]
RENUMBERED_SLOTS = [
    ("0000:21:00", 16),
    ("0000:31:00", 19),
    ("0000:41:00", 22),
    ("0000:51:00", 25),
    ("0000:a1:00", 31),
    ("0000:b1:00", 34),
    ("0000:c1:00", 37),
    ("0000:d1:00", 40),
]


PVE12 = {"pve1", "pve2"}


def line(node: str, path: str, group: int) -> str:
    return f"id=10de:2bb1,node={node},path={path},iommugroup={group},subsystem-id=10de:204b"


@pytest.fixture(scope="module")
def hw(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HostHardware]:
    root = tmp_path_factory.mktemp("sys")
    names = ("reference", "reference-renumbered", "shared-with-nic")
    for name in names:
        write_tree(root / name, name)
    return {name: read_hardware_locally(root / name) for name in names}


def topo(hardware: HostHardware) -> Topology:
    return plan_topology(hardware, RTX)


def test_create_one_node_one_mapping_per_gpu_in_physical_order(hw: dict[str, HostHardware]) -> None:
    planned = plan_mappings({"pve1": topo(hw["reference"])})
    assert planned == tuple(
        PciMapping(f"gpu{n}", (line("pve1", path, group),)) for n, (path, group) in enumerate(REFERENCE_SLOTS)
    )


def test_bios_renumbered_keeps_each_name_on_its_slot(hw: dict[str, HostHardware]) -> None:
    """Slot 1's card is gpu0 at 0000:41:00 before and at 0000:21:00 after; 0000:41:00 is then gpu2."""
    planned = plan_mappings({"pve1": topo(hw["reference-renumbered"])})
    assert [m.map for m in planned] == [(line("pve1", path, group),) for path, group in RENUMBERED_SLOTS]


def test_two_nodes_one_map_line_per_node_sorted_by_node(hw: dict[str, HostHardware]) -> None:
    planned = plan_mappings({"pve2": topo(hw["reference-renumbered"]), "pve1": topo(hw["reference"])})
    assert len(planned) == 8
    assert planned[0] == PciMapping("gpu0", (line("pve1", "0000:41:00", 14), line("pve2", "0000:21:00", 16)))
    assert planned[7].map == (line("pve1", "0000:f1:00", 38), line("pve2", "0000:d1:00", 40))


def test_create_clique_gpus_single_function_per_node(hw: dict[str, HostHardware]) -> None:
    """A node's GPUs with a GPUDirect clique are mapped by their display function (`.0`); the other GPUs,
    and the other node's lines, keep the whole slot."""
    topologies = {"pve1": topo(hw["reference"]), "pve2": topo(hw["reference-renumbered"])}
    planned = plan_mappings(topologies, single_function={"pve1": {0, 7}})
    assert planned[0].map == (line("pve1", "0000:41:00.0", 14), line("pve2", "0000:21:00", 16))
    assert planned[1].map == (line("pve1", "0000:51:00", 17), line("pve2", "0000:31:00", 19))
    assert planned[7].map == (line("pve1", "0000:f1:00.0", 38), line("pve2", "0000:d1:00", 40))
    assert plan_mappings(topologies, single_function={"pve1": set()}) == plan_mappings(topologies)


def test_update_path_shape_of_one_node_line_only() -> None:
    """`with_path_shape`: this node's line to `.0` and back; another node's line, a line already of that
    shape and a `;` alternative byte for byte."""
    gui = "node=pve1,path=0000:41:00,id=10de:2bb1,iommugroup=14,subsystem-id=10de:204b"  # the GUI's key order
    other = line("pve2", "0000:21:00", 16)
    whole = PciMapping("gpu0", (gui, other))
    single = with_path_shape(whole, "pve1", single_function=True)
    assert single.map == (line("pve1", "0000:41:00.0", 14), other)
    assert with_path_shape(single, "pve1", single_function=True) == single
    assert with_path_shape(single, "pve1", single_function=False).map == (
        line("pve1", "0000:41:00", 14),
        other,
    )
    assert with_path_shape(whole, "pve1", single_function=False) == whole
    alternatives = PciMapping("gpu0", (line("pve1", "0000:41:00;0000:51:00", 14),))
    assert with_path_shape(alternatives, "pve1", single_function=True) == alternatives


def test_diff_single_function_path_is_an_update(hw: dict[str, HostHardware]) -> None:
    """Switching `vm.p2p` on (or back off) changes the path: an UPDATE of that mapping only."""
    whole = plan_mappings({"pve1": topo(hw["reference"])})
    single = plan_mappings({"pve1": topo(hw["reference"])}, single_function={"pve1": {0}})
    changes = diff_mappings(single, whole, cluster={"pve1"})
    assert [(change.id, change.action) for change in changes[:2]] == [
        ("gpu0", Action.UPDATE),
        ("gpu1", Action.UNCHANGED),
    ]
    assert changes[0].map == (line("pve1", "0000:41:00.0", 14),)
    assert diff_mappings(whole, single, cluster={"pve1"})[0].map == (line("pve1", "0000:41:00", 14),)


def test_prefix_is_configurable(hw: dict[str, HostHardware]) -> None:
    planned = plan_mappings({"pve1": topo(hw["reference"])}, prefix="rtx-")
    assert [m.id for m in planned] == [f"rtx-{n}" for n in range(8)]


def test_error_prefix_that_gives_no_mapping_id() -> None:
    with pytest.raises(ValueError, match=r"^mapping prefix '9x' gives '9x0', not a Proxmox mapping id$"):
        mapping_id("9x", 0)


def test_error_refused_gpu_is_named_and_nothing_is_mapped(hw: dict[str, HostHardware]) -> None:
    with pytest.raises(MappingPlanError) as raised:
        plan_mappings({"pve1": topo(hw["reference"]), "pve2": topo(hw["shared-with-nic"])})
    assert raised.value.problems == (
        "pve2: gpu3 0000:73:00 (10de:2bb1) is refused: IOMMU group 21 also holds 0000:74:00.0 "
        "(Ethernet controller [0200] 15b3:101d); pass the whole group or move the card",
    )


def test_error_count_problem_of_a_node(hw: dict[str, HostHardware]) -> None:
    with pytest.raises(MappingPlanError) as raised:
        plan_mappings({"pve1": plan_topology(hw["reference"], GpuSelector(ids=("10de:2bb1",), count=4))})
    assert str(raised.value) == "pve1: expected 4 GPUs with id 10de:2bb1, found 8"


def test_error_nodes_disagree_on_the_number_of_gpus(hw: dict[str, HostHardware]) -> None:
    reference = hw["reference"]
    seven = HostHardware(
        tuple(f for f in reference.functions if not f.address.startswith("0000:f1:00")),
        reference.iommu_present,
    )
    with pytest.raises(MappingPlanError) as raised:
        plan_mappings({"pve1": topo(reference), "pve2": topo(seven)})
    assert str(raised.value) == "nodes disagree on the number of GPUs: pve1 has 8, pve2 has 7"


def test_error_nodes_disagree_on_a_model(hw: dict[str, HostHardware]) -> None:
    reference = hw["reference"]
    other = HostHardware(
        tuple(
            dataclasses.replace(f, device="2bb5") if f.address == "0000:d1:00.0" else f
            for f in reference.functions
        ),
        reference.iommu_present,
    )
    both = GpuSelector(ids=("10de:2bb1", "10de:2bb5"))
    with pytest.raises(MappingPlanError) as raised:
        plan_mappings({"pve1": plan_topology(reference, both), "pve2": plan_topology(other, both)})
    assert str(raised.value) == "nodes disagree on the model of GPU 5: pve1 has 10de:2bb1, pve2 has 10de:2bb5"


def test_error_no_node() -> None:
    with pytest.raises(MappingPlanError, match=r"^no node to map$"):
        plan_mappings({})


def test_managed_index() -> None:
    assert [managed_index("gpu", name) for name in ("gpu0", "gpu12", "gpu", "gpu01", "gpu-a", "nic0")] == [
        0,
        12,
        None,
        None,
        None,
        None,
    ]


def test_diff_create_update_unchanged_and_foreign_ids_untouched(hw: dict[str, HostHardware]) -> None:
    desired = plan_mappings({"pve1": topo(hw["reference-renumbered"])})[:3]
    # gpu0 as the GUI writes it (path,node,id,subsystem-id,iommugroup): same meaning, other text
    gui = "path=0000:21:00,node=pve1,id=10de:2bb1,subsystem-id=10de:204b,iommugroup=16"
    current = [
        PciMapping("gpu0", (gui,)),
        PciMapping("gpu1", (line("pve1", "0000:51:00", 17),)),  # before the BIOS change
        PciMapping("nic0", ("id=8086:1592,node=pve1,path=0000:43:00.0",)),  # not pvegpu's
        PciMapping("gpu8", (line("pve1", "0000:99:00", 99),)),  # pvegpu's, no longer desired: left alone
    ]
    assert diff_mappings(desired, current, cluster={"pve1"}) == (
        MappingChange(Action.UNCHANGED, "gpu0", desired[0].map, (gui,)),
        MappingChange(Action.UPDATE, "gpu1", desired[1].map, (line("pve1", "0000:51:00", 17),)),
        MappingChange(Action.CREATE, "gpu2", desired[2].map, None),
    )


def test_diff_unparsable_current_entry_is_updated() -> None:
    desired = [PciMapping("gpu0", (line("pve1", "0000:41:00", 14),))]
    current = [PciMapping("gpu0", ("['node=pve1,path=0000:41:00']",))]
    assert [c.action for c in diff_mappings(desired, current, cluster={"pve1"})] == [Action.UPDATE]


def test_diff_line_order_does_not_matter_but_an_extra_line_does() -> None:
    a, b = line("pve1", "0000:41:00", 14), line("pve2", "0000:21:00", 16)
    desired = [PciMapping("gpu0", (a, b))]
    assert [c.action for c in diff_mappings(desired, [PciMapping("gpu0", (b, a))], cluster=PVE12)] == [
        Action.UNCHANGED
    ]
    assert [c.action for c in diff_mappings(desired, [PciMapping("gpu0", (a, b, b))], cluster=PVE12)] == [
        Action.UPDATE
    ]


def test_error_diff_refuses_a_desired_id_outside_the_scheme() -> None:
    with pytest.raises(ValueError, match=r"^mapping 'nic0' is not of pvegpu's scheme gpu<N>$"):
        diff_mappings([PciMapping("nic0", ())], [], cluster={"pve1"})


def test_diff_keeps_the_line_of_a_node_outside_the_cluster_verbatim() -> None:
    ours = line("pve1", "0000:41:00", 14)
    theirs = "path=0000:21:00,node=pve2,id=10de:2bb1"  # another admin's, GUI key order, no group
    desired = [PciMapping("gpu0", (ours,))]

    assert diff_mappings(desired, [PciMapping("gpu0", (theirs, ours))], cluster={"pve1"}) == (
        MappingChange(Action.UNCHANGED, "gpu0", (ours, theirs), (theirs, ours), kept=(theirs,)),
    )


def test_diff_update_of_a_cluster_line_writes_the_kept_line_back_sorted_by_node() -> None:
    ours, old = line("pve2", "0000:41:00", 14), line("pve2", "0000:21:00", 9)
    theirs = line("pve1", "0000:61:00", 20)
    desired = [PciMapping("gpu0", (ours,))]

    assert diff_mappings(desired, [PciMapping("gpu0", (old, theirs))], cluster={"pve2"}) == (
        MappingChange(Action.UPDATE, "gpu0", (theirs, ours), (old, theirs), kept=(theirs,)),
    )


def test_diff_replaces_the_line_of_a_node_in_the_cluster() -> None:
    a, b = line("pve1", "0000:41:00", 14), line("pve2", "0000:41:00", 14)
    stale = line("pve2", "0000:21:00", 9)
    desired = [PciMapping("gpu0", (a, b))]

    assert diff_mappings(desired, [PciMapping("gpu0", (a, stale))], cluster=PVE12) == (
        MappingChange(Action.UPDATE, "gpu0", (a, b), (a, stale)),
    )


def test_diff_replaces_an_unreadable_entry_it_cannot_attribute_to_a_node() -> None:
    ours = line("pve1", "0000:41:00", 14)
    broken = "node=pve2,path=0000:21:00"  # no id: Proxmox itself refuses it
    desired = [PciMapping("gpu0", (ours,))]

    assert diff_mappings(desired, [PciMapping("gpu0", (ours, broken))], cluster={"pve1"}) == (
        MappingChange(Action.UPDATE, "gpu0", (ours,), (ours, broken)),
    )
