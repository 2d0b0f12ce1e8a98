"""Parsers and the topology planner on real output captured on a machine with an NVIDIA GPU: an H200 passed
through to a VM (the lab machine lent to this project, captured 2026-11-29; sources in each fixture's first
line). No IOMMU inside that VM, so the planner must refuse to pass the GPU on, naming why."""

from __future__ import annotations

from pathlib import Path

from pvegpu.facts.hardware import parse_hardware
from pvegpu.facts.nvidia import parse_nvidia_smi, parse_version_file
from pvegpu.models.hardware import Bar, Link
from pvegpu.models.nvidia import LoadedModule, NvidiaGpu
from pvegpu.plan.topology import Verdict, plan_vendor_topology

FIXTURES = Path(__file__).parents[1] / "fixtures"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()[1:]  # the first line is the source note


def test_hardware_fact_reads_the_real_h200_function() -> None:
    hardware = parse_hardware(lines("pci_hardware_h200_vm.txt"))
    assert [f.address for f in hardware.functions] == [f"0000:00:0{n}.0" for n in range(7)]
    assert not hardware.iommu_present
    gpu = hardware.by_address["0000:00:06.0"]
    assert (gpu.id, gpu.subsystem_id, gpu.class_code, gpu.driver) == (
        "10de:2335",
        "10de:18bf",
        0x030200,
        "nvidia",
    )
    assert (gpu.iommu_group, gpu.numa_node, gpu.root_bus, gpu.parents) == (None, None, "0000:00", ())
    assert gpu.link == Link(32.0, 16, 32.0, 16)
    # resource lines 0, 2, 4: 16 MiB, 256 GiB, 32 MiB, all 64-bit prefetchable (flags 0x14220c)
    assert gpu.bars == (
        Bar(0, 0x104002000000, 16 << 20, True, True, False),
        Bar(2, 0x100000000000, 256 << 30, True, True, False),
        Bar(4, 0x104000000000, 32 << 20, True, True, False),
    )


def test_planner_refuses_a_gpu_without_an_iommu_group() -> None:
    topology = plan_vendor_topology(parse_hardware(lines("pci_hardware_h200_vm.txt")), "10de")
    [gpu] = topology.gpus
    assert (gpu.name, gpu.address, gpu.functions, gpu.verdict) == (
        "gpu0",
        "0000:00:06",
        ("0000:00:06.0",),
        Verdict.REFUSED,
    )
    assert gpu.reason == (
        "no IOMMU group: the IOMMU is off "
        "(enable AMD-Vi/VT-d in firmware and the IOMMU in the kernel cmdline)"
    )


def test_nvidia_facts_read_the_real_driver_output() -> None:
    assert parse_version_file(lines("proc_driver_nvidia_version_h200.txt")) == LoadedModule(
        "open", "580.159.04"
    )
    smi = parse_nvidia_smi(lines("nvidia_smi_query_h200.txt"))
    assert smi.error is None
    assert smi.gpus == (NvidiaGpu(0, "NVIDIA H200", "00000000:00:06.0", "580.159.04"),)
