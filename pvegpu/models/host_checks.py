"""What the doctor's host checks observe (pvegpu/facts/host_checks.py reads it in one command): interrupt
remapping, cpu0's idle states, NUMA nodes, raw PCI config space and IOMMU groups' DMA domain types. Plain
frozen data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class IdleState:
    """One cpuidle state of cpu0 (`POLL`, `C1`, `C2`, ...) and whether it is disabled."""

    index: int
    name: str
    disabled: bool


@dataclass(frozen=True)
class HostCheckData:
    """`remapped_interrupts`: lines of /proc/interrupts on an `IR-` (remapped) chip. `config`: raw config
    space bytes per address (as long as the read returned). `group_types`: the default DMA domain type per
    IOMMU group read (`identity`: passthrough; `DMA`, `DMA-FQ`: translated)."""

    remapped_interrupts: int
    idle_states: tuple[IdleState, ...]
    numa_cpulists: dict[int, str]
    config: dict[str, bytes]
    group_types: dict[int, str] = field(default_factory=dict)
