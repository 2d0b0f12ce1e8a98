"""Read-only host checks for the doctor: interrupt remapping, CPU idle states, NUMA nodes, the PCI config
space of the GPUs and the ports above them (ACS, Resizable BAR), and the default DMA domain type of the GPUs'
IOMMU groups (`kernel/iommu_groups/N/type`: `identity`, `DMA`, `DMA-FQ`, ... as drivers/iommu/iommu.c
`iommu_group_show_type` prints it). One command; parsing is pure.

Config space beyond the first 64 bytes is readable by root only: the bytes are returned as read, and
pvegpu/plan/host_checks.py decodes them (and reports a short read as such).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.sections import marker, split_sections
from pvegpu.models.host_checks import HostCheckData, IdleState

_SECTIONS = ("interrupts", "cpuidle", "numa", "config", "iommu_types", "end")
# Numbers at most 9 (a count 18) ASCII digits: the kernel prints none longer, and int() refuses 4300+.
_CPUIDLE = re.compile(r".*/cpuidle/state([0-9]{1,9})/(name|disable):(.*)")
_NUMA = re.compile(r".*/node/node([0-9]{1,9})/cpulist:(.*)")
_COUNT = re.compile(r"[0-9]{1,18}")
_GROUP_TYPE = re.compile(r".*/kernel/iommu_groups/([0-9]{1,9})/type:(.*)")
_CONFIG = re.compile(r"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ?([0-9a-f]*)")


class HostChecks(FactBase[HostCheckData]):
    """Interrupt remapping, cpu0's idle states, NUMA nodes, config space of `addresses`, the DMA domain type
    of IOMMU `groups` (module docstring)."""

    @override
    def command(
        self, sysfs_root: str = "/sys", addresses: Sequence[str] = (), groups: Sequence[int] = ()
    ) -> str:
        root = shlex.quote(sysfs_root.rstrip("/"))
        idle = f"{root}/devices/system/cpu/cpu0/cpuidle"
        devices = " ".join(shlex.quote(a) for a in addresses)
        types = " ".join(f"{root}/kernel/iommu_groups/{int(group)}/type" for group in groups)
        return "; ".join(
            (
                f"echo {shlex.quote(marker('interrupts'))}",
                "grep -c 'IR-' /proc/interrupts || true",
                f"echo {shlex.quote(marker('cpuidle'))}",
                f"grep -sH . {idle}/state*/name {idle}/state*/disable || true",
                f"echo {shlex.quote(marker('numa'))}",
                f"grep -sH . {root}/devices/system/node/node*/cpulist || true",
                f"echo {shlex.quote(marker('config'))}",
                f'for a in {devices}; do printf "%s " "$a"; '
                f"od -An -v -tx1 {root}/bus/pci/devices/$a/config | tr -d ' \\n'; echo; done",
                f"echo {shlex.quote(marker('iommu_types'))}",
                *([f"grep -sH . {types} || true"] if groups else []),
                f"echo {shlex.quote(marker('end'))}",
            )
        )

    @override
    def process(self, output: list[str]) -> HostCheckData:
        return parse_host_checks(output)


def parse_host_checks(lines: Sequence[str]) -> HostCheckData:
    """Output of `HostChecks().command(...)` -> HostCheckData. Pure; FactParseError names the bad line."""
    sections = split_sections(lines, _SECTIONS)
    counts = [line.strip() for _, line in sections["interrupts"] if line.strip()]
    if len(counts) != 1 or not _COUNT.fullmatch(counts[0]):
        raise FactParseError(f"interrupts: expected one count, got {counts!r}")
    names: dict[int, str] = {}
    disabled: dict[int, bool] = {}
    for number, line in sections["cpuidle"]:
        match = _CPUIDLE.fullmatch(line)
        if match is None:
            raise FactParseError(
                f"line {number}: expected .../cpuidle/stateN/name|disable:VALUE, got {line!r}"
            )
        if match[2] == "name":
            names[int(match[1])] = match[3]
        else:
            disabled[int(match[1])] = match[3].strip() == "1"
    numa: dict[int, str] = {}
    for number, line in sections["numa"]:
        match = _NUMA.fullmatch(line)
        if match is None:
            raise FactParseError(f"line {number}: expected .../node/nodeN/cpulist:LIST, got {line!r}")
        numa[int(match[1])] = match[2]
    config: dict[str, bytes] = {}
    for number, line in sections["config"]:
        match = _CONFIG.fullmatch(line.strip())
        if match is None or len(match[2]) % 2:
            raise FactParseError(f"line {number}: expected '<address> <hex bytes>', got {line[:80]!r}")
        config[match[1]] = bytes.fromhex(match[2])
    group_types: dict[int, str] = {}
    for number, line in sections["iommu_types"]:
        match = _GROUP_TYPE.fullmatch(line)
        if match is None:
            raise FactParseError(f"line {number}: expected .../kernel/iommu_groups/N/type:TYPE, got {line!r}")
        group_types[int(match[1])] = match[2].strip()
    states = tuple(IdleState(i, names[i], disabled.get(i, False)) for i in sorted(names))
    return HostCheckData(int(counts[0]), states, numa, config, group_types)
