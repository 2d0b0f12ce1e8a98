"""Proxmox's live mapping check (assert_valid / check-node) against lab trees and small hand-made hardware.
Expected messages: shared/knowledge/proxmox-pci-mapping.md §3 and proxmox-api-behaviour.md §3, §4.7.
"""

from __future__ import annotations

import dataclasses

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.hardware import HostHardware, PciFunction
from pvegpu.models.node import GpuSelector
from pvegpu.models.pve import MapEntry, MappingCheck, PciMapping, Severity
from pvegpu.plan.mapping import plan_mappings
from pvegpu.plan.topology import plan_topology
from tests.unit.proxmox_mapping_check import MappingInvalidError, assert_valid, check_node

RTX = GpuSelector(ids=("10de:2bb1",))


@pytest.fixture(scope="module")
def hw(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HostHardware]:
    root = tmp_path_factory.mktemp("sys")
    for name in ("reference", "reference-renumbered"):
        write_tree(root / name, name)
    return {name: read_hardware_locally(root / name) for name in ("reference", "reference-renumbered")}


def gpu(group: int | None = 13) -> HostHardware:
    function = PciFunction(
        address="0000:01:00.0",
        vendor="10de",
        device="2204",
        subsystem_vendor="1458",
        subsystem_device="403b",
        class_code=0x030000,
        driver=None,
        iommu_group=group,
        numa_node=None,
        root_bus="0000:00",
    )
    return HostHardware((function,), iommu_present=group is not None)


ENTRY = MapEntry("pve1", "0000:01:00", "10de:2204", "1458:403b", 13)


def invalid(entry: MapEntry, hardware: HostHardware, section: PciMapping | None = None) -> str:
    with pytest.raises(MappingInvalidError) as raised:
        assert_valid("gpu0", entry, hardware, section)
    return str(raised.value)


def test_generated_mappings_pass_on_their_own_trees(hw: dict[str, HostHardware]) -> None:
    topologies = {
        node: plan_topology(hw[name], RTX)
        for node, name in (("pve1", "reference"), ("pve2", "reference-renumbered"))
    }
    for mapping in plan_mappings(topologies):
        assert check_node(mapping, "pve1", hw["reference"]) == ()
        assert check_node(mapping, "pve2", hw["reference-renumbered"]) == ()


def test_bios_renumbered_old_mapping_fails_with_proxmox_message(hw: dict[str, HostHardware]) -> None:
    old = plan_mappings({"pve1": plan_topology(hw["reference"], RTX)})
    renumbered = hw["reference-renumbered"]
    # 0000:41:00 now holds slot 3's card (group 22); same model, so the id passes and the group fails
    assert check_node(old[0], "pve1", renumbered) == (
        MappingCheck(
            Severity.ERROR, "Invalid configuration: 'iommugroup' does not match for 'gpu0' (22 != 14)\n"
        ),
    )
    # 0000:f1:00 does not exist any more
    assert check_node(old[7], "pve1", renumbered) == (
        MappingCheck(Severity.ERROR, "Invalid configuration: pci device '0000:f1:00.0' not found\n"),
    )


def test_error_group_renumbered_is_the_oracle_case() -> None:
    message = invalid(dataclasses.replace(ENTRY, iommugroup=12), gpu(13))
    assert message == "'iommugroup' does not match for 'gpu0' (13 != 12)"


def test_valid_entry_passes() -> None:
    assert_valid("gpu0", ENTRY, gpu(), PciMapping("gpu0", (ENTRY.text,), mdev=False))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            dataclasses.replace(ENTRY, subsystem_id=None),
            "missing expected property 'subsystem-id' for device '0000:01:00.0'",
        ),
        (
            dataclasses.replace(ENTRY, iommugroup=None),
            "missing expected property 'iommugroup' for device '0000:01:00.0'",
        ),
        # the syntax allows uppercase, the live check compares with lowercase sysfs
        (
            dataclasses.replace(ENTRY, id="10DE:2204"),
            "'id' does not match for 'gpu0' (10de:2204 != 10DE:2204)",
        ),
        (
            dataclasses.replace(ENTRY, id="10de:2205", iommugroup=1),
            "'id' does not match for 'gpu0' (10de:2204 != 10de:2205)",
        ),
        (dataclasses.replace(ENTRY, path="0000:02:00"), "pci device '0000:02:00.0' not found"),
        (dataclasses.replace(ENTRY, path="0000:01:00.1"), "pci device '0000:01:00.1' not found"),
    ],
)
def test_error_entry(entry: MapEntry, message: str) -> None:
    assert invalid(entry, gpu()) == message


def test_error_group_configured_but_no_iommu() -> None:
    assert (
        invalid(ENTRY, gpu(None)) == "unexpected property 'iommugroup' configured for device '0000:01:00.0'"
    )


def test_error_mdev_section_on_hardware_without_mediated_devices() -> None:
    section = PciMapping("gpu0", (ENTRY.text,), mdev=True)
    assert invalid(ENTRY, gpu(), section) == "'mdev' does not match for 'gpu0' (0 != 1)"
    assert_valid(
        "gpu0", ENTRY, gpu()
    )  # without the section (as Proxmox's own callers may), mdev is not compared


def test_group_is_checked_for_the_first_alternative_only() -> None:
    second = dataclasses.replace(gpu().functions[0], address="0000:02:00.0", iommu_group=99)
    hardware = HostHardware((*gpu().functions, second), iommu_present=True)
    assert_valid("gpu0", dataclasses.replace(ENTRY, path="0000:01:00;0000:02:00"), hardware)
    assert invalid(dataclasses.replace(ENTRY, path="0000:02:00;0000:01:00"), hardware) == (
        "'iommugroup' does not match for 'gpu0' (99 != 13)"
    )


def test_check_node_without_an_entry_for_the_node_warns() -> None:
    assert check_node(PciMapping("gpu0", (ENTRY.text,)), "pve2", gpu()) == (
        MappingCheck(Severity.WARNING, "No mapping for node pve2."),
    )
