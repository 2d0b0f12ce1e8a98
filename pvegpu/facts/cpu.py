"""The CPU vendor (which IOMMU the platform has: AMD-Vi or Intel VT-d), its physical address bits (which
bound the VM's 64-bit MMIO window: plan/mmio.py), the running kernel release and the installed qemu-server
version (which `cpu` options Proxmox knows: `guest-phys-bits` since 9.0.18)."""

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
# /proc/cpuinfo (arch/x86/kernel/cpu/proc.c show_cpuinfo):
# "address sizes\t: 52 bits physical, 57 bits virtual"
_ADDRESS_LINE = re.compile(r"address sizes\s*:\s*([0-9]{1,3}) bits physical, [0-9]{1,3} bits virtual")
_QEMU_SERVER_LINE = re.compile(r"qemu-server (\S\S)\S? ?(\S*)")
_VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})(\D\S*)?")
QEMU_SERVER_QUERY = "dpkg-query -W -f='qemu-server ${db:Status-Abbrev}${Version}\\n' qemu-server 2>/dev/null"


class CpuAndKernel(FactBase[CpuKernel]):
    """The running kernel release (`uname -r`, `6.8.12-4-pve` -> (6, 8)), the CPU vendor and physical address
    bits (the first `vendor_id` and `address sizes` lines of /proc/cpuinfo) and qemu-server's version
    (`dpkg-query`: `qemu-server ii 9.2.6`), in one command."""

    @override
    def command(self) -> str:
        return (
            "uname -r && { grep -m2 -E '^(vendor_id|address sizes)' /proc/cpuinfo || true; } && "
            f"{{ {QEMU_SERVER_QUERY} || true; }}"
        )

    @override
    def process(self, output: list[str]) -> CpuKernel:
        return parse_cpu_kernel(output)


def parse_cpu_kernel(lines: Sequence[str]) -> CpuKernel:
    """The output of `CpuAndKernel`'s command: the release line, then at most the vendor line, the address
    sizes line and the qemu-server line. Pure; raises FactParseError naming what is wrong."""
    text = [line for line in lines if line.strip()]
    if not text:
        raise FactParseError("uname -r: no output")
    rest = text[1:]
    sizes = [line for line in rest if line.startswith("address sizes")]
    packages = [line for line in rest if line.startswith("qemu-server ")]
    vendor = [line for line in rest if line not in sizes and line not in packages]
    return CpuKernel(
        vendor=parse_cpu_vendor(vendor),
        release=parse_kernel_release(text[:1]),
        phys_bits=parse_phys_bits(sizes),
        qemu_server=parse_qemu_server(packages),
    )


def parse_phys_bits(lines: Sequence[str]) -> int | None:
    """`address sizes\t: 52 bits physical, 57 bits virtual` -> 52; no line -> None. Pure; FactParseError for
    another shape."""
    if not lines:
        return None
    match = _ADDRESS_LINE.fullmatch(lines[0].strip()) if len(lines) == 1 else None
    if match is None:
        raise FactParseError(
            f"/proc/cpuinfo: expected one 'address sizes : <N> bits physical, <M> bits virtual' line, "
            f"got {list(lines)!r}"
        )
    return int(match[1])


def parse_qemu_server(lines: Sequence[str]) -> tuple[int, int, int] | None:
    """`qemu-server ii 9.2.6` -> (9, 2, 6); not installed (no line, or a status other than `ii`) -> None.
    Pure; FactParseError for another shape."""
    if not lines:
        return None
    match = _QEMU_SERVER_LINE.fullmatch(lines[0].strip()) if len(lines) == 1 else None
    if match is None:
        raise FactParseError(
            f"dpkg-query: expected one 'qemu-server <status> <version>' line, got {list(lines)!r}"
        )
    if match[1] != "ii":
        return None
    version = _VERSION.fullmatch(match[2])
    if version is None:
        raise FactParseError(f"dpkg-query: qemu-server version {match[2]!r} is not <major>.<minor>.<patch>")
    return int(version[1]), int(version[2]), int(version[3])


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
