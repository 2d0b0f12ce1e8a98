"""The VM's 64-bit MMIO window, sized from the passed GPUs' BARs. Pure.

Large-BAR GPUs (the reference card has a 128 GiB BAR1) do not fit OVMF's default 64-bit PCI aperture,
and the guest then fails to assign their BARs. Two ways to give the guest a big enough window:

- `args` (pvegpu's choice): `-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=<MiB>` sets OVMF's aperture to
  exactly the size computed here, whatever the OVMF version's own heuristics. Proxmox stores `args` raw and
  lets **only root@pam** set it (`only root can set 'args' config`): with an API token, or any other user,
  pvegpu refuses (`mmio_refusal`) instead of failing half-way.
- `phys-bits`: `cpu: host,phys-bits=<N>` widens the guest's physical address space; recent OVMF sizes its
  aperture from it. Settable with VM.Config.CPU (API tokens included), but the window size is left to
  OVMF, so it is the fallback when root@pam is not available.

Size: every 64-bit prefetchable memory BAR (indices 0-5) of every passed function. Each card sits behind
its own virtual root port, whose window holds the card's BARs (each aligned to its size, largest first)
and is itself aligned to the card's largest BAR; the ports' windows are laid out the same way. The end of
that layout, rounded up to a power of two, is doubled as headroom for the aperture's own alignment and the
other 64-bit devices of the VM (virtio).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pvegpu.models.hardware import HostHardware, PciFunction
from pvegpu.plan.topology import GpuCard

MIB = 1 << 20
GIB = 1 << 30
HEADROOM_FACTOR = 2
BAR_INDICES = range(6)  # 6 is the expansion ROM
MmioStrategy = Literal["args", "phys-bits"]
ROOT_USER = "root@pam"


@dataclass(frozen=True)
class MmioWindow:
    """`bar_bytes`: the 64-bit prefetchable BARs laid out; `window_mib`: the aperture (power of two);
    `args`: the OVMF fw_cfg argument; `phys_bits`: address bits that hold RAM and the window above it."""

    bar_bytes: int
    window_mib: int
    args: str
    phys_bits: int


def passed_functions(hw: HostHardware, cards: Sequence[GpuCard]) -> list[list[PciFunction]]:
    """The functions each card passes (every function of its slot), grouped per card."""
    return [[hw.by_address[address] for address in card.functions] for card in cards]


def plan_mmio(cards: Sequence[Sequence[PciFunction]], memory_mib: int) -> MmioWindow:
    """The window for `cards` (the functions of each passed card) in a VM with `memory_mib` of RAM.

    Raises ValueError when no card has a 64-bit prefetchable BAR (nothing to size: no window needed).
    """
    ports = [_layout(_bar_sizes(functions)) for functions in cards]
    ports = [(size, align) for size, align in ports if size]
    if not ports:
        raise ValueError("no 64-bit prefetchable BAR among the passed functions")
    end = 0
    for size, align in sorted(ports, key=lambda port: (-port[1], -port[0])):
        end = _align_up(end, align) + size
    window = _power_of_two(end) * HEADROOM_FACTOR
    window_mib = max(window // MIB, 1)
    # OVMF puts the aperture above RAM (which starts again at 4 GiB), aligned to the aperture's size.
    top = _align_up(4 * GIB + memory_mib * MIB, window) + window
    return MmioWindow(
        bar_bytes=end,
        window_mib=window_mib,
        args=f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={window_mib}",
        phys_bits=(top - 1).bit_length(),
    )


def mmio_refusal(strategy: MmioStrategy, user: str) -> str | None:
    """Why `user` (`root@pam`, `user@realm`, `user@realm!token`) cannot apply `strategy`; None if it can."""
    if strategy == "args" and user != ROOT_USER:
        return (
            "the 64-bit MMIO window is set through the VM's `args` (OVMF X-PciMmio64Mb), which only "
            f"root@pam can set, and the API is used as {user}: use root@pam, or set vm.mmio to 'phys-bits'"
        )
    return None


def _bar_sizes(functions: Iterable[PciFunction]) -> list[int]:
    return [
        bar.size
        for function in functions
        for bar in function.bars
        if bar.index in BAR_INDICES and bar.is_64bit and bar.prefetchable and not bar.is_io and bar.size
    ]


def _layout(sizes: list[int]) -> tuple[int, int]:
    """(end of the BARs laid out largest first, each aligned to its size; alignment = the largest BAR)."""
    end = 0
    for size in sorted(sizes, reverse=True):
        end = _align_up(end, size) + size
    return end, max(sizes, default=1)


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _power_of_two(value: int) -> int:
    return 1 << (value - 1).bit_length()
