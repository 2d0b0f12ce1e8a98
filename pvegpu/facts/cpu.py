"""The CPU vendor (which IOMMU the platform has: AMD-Vi or Intel VT-d) and the running kernel release."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.models.boot import CpuKernel

# /proc/cpuinfo `vendor_id` (x86 only) -> the vendor word of the kernel's `<vendor>_iommu=` parameter.
VENDORS = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}
_VENDOR_LINE = re.compile(r"vendor_id\s*:\s*(\S+)")
_RELEASE = re.compile(r"([0-9]{1,9})\.([0-9]{1,9})\S*")  # bounded: int() refuses 4300+ digits


class CpuAndKernel(FactBase[CpuKernel]):
    """The running kernel release (`uname -r`, `6.8.12-4-pve` -> (6, 8)) and the CPU vendor (the first
    `vendor_id` line of /proc/cpuinfo), in one command."""

    @override
    def command(self) -> str:
        return "uname -r && { grep -m1 '^vendor_id' /proc/cpuinfo || true; }"

    @override
    def process(self, output: list[str]) -> CpuKernel:
        return parse_cpu_kernel(output)


def parse_cpu_kernel(lines: Sequence[str]) -> CpuKernel:
    """The output of `CpuAndKernel`'s command: the release line, then at most the vendor line. Pure;
    raises FactParseError naming what is wrong."""
    text = [line for line in lines if line.strip()]
    if not text:
        raise FactParseError("uname -r: no output")
    return CpuKernel(vendor=parse_cpu_vendor(text[1:]), release=parse_kernel_release(text[:1]))


def parse_cpu_vendor(lines: Sequence[str]) -> str | None:
    """`vendor_id\\t: AuthenticAMD` -> `amd`; no output -> None. Pure.

    Raises FactParseError for another line shape or a vendor without a known IOMMU parameter.
    """
    text = [line for line in lines if line.strip()]
    if not text:
        return None
    match = _VENDOR_LINE.fullmatch(text[0].strip())
    if match is None or len(text) != 1:
        raise FactParseError(f"/proc/cpuinfo: expected one 'vendor_id : <vendor>' line, got {text!r}")
    if match[1] not in VENDORS:
        raise FactParseError(
            f"/proc/cpuinfo: CPU vendor {match[1]!r} is neither {' nor '.join(sorted(VENDORS))}"
        )
    return VENDORS[match[1]]


def parse_kernel_release(lines: Sequence[str]) -> tuple[int, int]:
    """`6.8.12-4-pve` -> (6, 8). Pure; raises FactParseError for anything else."""
    text = [line.strip() for line in lines if line.strip()]
    match = _RELEASE.fullmatch(text[0]) if len(text) == 1 else None
    if match is None:
        raise FactParseError(f"uname -r: expected a release like 6.8.12-4-pve, got {text!r}")
    return int(match[1]), int(match[2])
