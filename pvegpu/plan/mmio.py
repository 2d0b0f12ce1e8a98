"""The VM's 64-bit MMIO window: sized from the passed GPUs' BARs, and what the guest really gets. Pure.

Large-BAR GPUs (the reference card has a 128 GiB BAR1) do not fit OVMF's default 64-bit PCI aperture (32 GiB:
OvmfPkgX64.dsc `PcdPciMmio64Size`), and the guest then fails to assign their BARs.

Size: every 64-bit prefetchable memory BAR (indices 0-5) of every passed function. Each card sits behind
its own virtual root port, whose window holds the card's BARs (each aligned to its size, largest first)
and is itself aligned to the card's largest BAR; the ports' windows are laid out the same way. The end of
that layout, rounded up to a power of two, is doubled as headroom for the aperture's own alignment and the
other 64-bit devices of the VM (virtio).

What the guest gets, as the upstream code decides it:

- QEMU: the `host` CPU model sets `host-phys-bits=true` (target/i386/host-cpu.c `host_cpu_max_instance_init`;
  `host`'s parent type is `max`), so `host_cpu_adjust_phys_bits` gives the guest the host's CPUID address
  width whatever `phys-bits=N` says, and only warns (`Host physical bits (H) does not match phys-bits property
  (N)`): pvegpu never writes `phys-bits`. `guest-phys-bits=G` (CPUID 0x80000008 EAX[23:16]; qemu-server
  CPUConfig.pm `get_cpu_options`, since qemu-server 9.0.18) is refused outside 32..H (target/i386/cpu.c
  `x86_cpu_realizefn`: `guest-phys-bits should be between 32 and H (but is G)`).
- OVMF (OvmfPkg/Library/PlatformInitLib/MemDetect.c): `PlatformAddressWidthFromCpuid` takes the CPU's width,
  limited to GuestPhysBits when that is set, then to 46 bits (4-level paging: the X64 build leaves
  `PcdUse5LevelPageTable` FALSE); `PlatformDynamicMmioWindow` makes the window the top eighth of that address
  space, `2^(bits-3)` bytes (when that is larger than the 32 GiB default and RAM stays below it), unless
  `opt/ovmf/X-PciMmio64Mb` overrides it: `PlatformGetFirstNonAddress` takes that size as given up to 16 TiB
  (`FwCfgPciMmio64Mb <= 0x1000000`; above, it is ignored as malformed) and places it above RAM, aligned to
  its size; it must end within the firmware's address width.

`vm.mmio` (`plan_mmio`'s `strategy`):

- `args`: `-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=<MiB>`, exactly the size computed here, `cpu: host`.
  Proxmox stores `args` raw and lets only root@pam set it (`mmio_refusal`).
- `phys-bits`: the `cpu` key (VM.Config.CPU: API tokens may set it). With qemu-server 9.0.18+, `cpu:
  host,guest-phys-bits=G`, G the smallest width whose window 2^(G-3) holds the computed size with RAM below
  it; with an older (or unknown) qemu-server `cpu: host`, and the window is what the host's width gives,
  2^(min(H, 46)-3).

`MmioWindow.guest` says what the guest gets; `problem` why it cannot hold the BARs (a size above 16 TiB, a
window beyond the firmware's address width, a width QEMU refuses), naming the numbers: the VM role refuses
such a plan before touching the node. H is the host's `address sizes` in /proc/cpuinfo: the kernel's figure,
which AMD's memory encryption (SME) may lower below CPUID's, so that the figure here is the smaller, safe
one; None (not known): nothing is checked against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pvegpu.models.hardware import HostHardware, PciFunction
from pvegpu.plan.topology import GpuCard

MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
HEADROOM_FACTOR = 2
BAR_INDICES = range(6)  # 6 is the expansion ROM
MmioStrategy = Literal["args", "phys-bits"]
ROOT_USER = "root@pam"
OVMF_MAX_BITS = 46  # MemDetect.c PlatformAddressWidthFromCpuid: "limit PhysBits to 46 (4-level paging)"
OVMF_OVERRIDE_MAX_MIB = 0x1000000  # MemDetect.c PlatformGetFirstNonAddress: X-PciMmio64Mb up to 16 TiB
OVMF_DEFAULT_WINDOW = 32 * GIB  # OvmfPkgX64.dsc PcdPciMmio64Size; the dynamic window must be larger
QEMU_MIN_GUEST_PHYS_BITS = 32  # target/i386/cpu.c x86_cpu_realizefn
GUEST_PHYS_BITS_SINCE = (9, 0, 18)  # qemu-server debian/changelog 9.0.18: "expose guest-phys-bits"


@dataclass(frozen=True)
class MmioWindow:
    """`bar_bytes`: the 64-bit prefetchable BARs laid out; `window_mib`: the aperture they need (a power of
    two); `args`: the OVMF fw_cfg argument of that size; `phys_bits`: address bits that hold RAM and that
    aperture above it (X-PciMmio64Mb's placement); `cpu`: the VM's `cpu` value; `guest`: what the guest gets
    (one line); `problem`: why the guest's window cannot hold the BARs (None: it can, or it is not known)."""

    bar_bytes: int
    window_mib: int
    args: str
    phys_bits: int
    cpu: str = "host"
    guest: str = ""
    problem: str | None = None


def passed_functions(hw: HostHardware, cards: Sequence[GpuCard]) -> list[list[PciFunction]]:
    """The functions each card passes (every function of its slot), grouped per card."""
    return [[hw.by_address[address] for address in card.functions] for card in cards]


def plan_mmio(
    cards: Sequence[Sequence[PciFunction]],
    memory_mib: int,
    strategy: MmioStrategy = "args",
    host_phys_bits: int | None = None,
    qemu_server: tuple[int, int, int] | None = None,
) -> MmioWindow:
    """The window for `cards` (the functions of each passed card) in a VM with `memory_mib` of RAM, set with
    `strategy` on a node whose CPU has `host_phys_bits` address bits and whose qemu-server is `qemu_server`
    ((major, minor, patch); None: not known), and what the guest gets (module docstring).

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
    # Above RAM (which starts again at 4 GiB: counting all of it there is the safe side), aligned to its size.
    ram_top = 4 * GIB + memory_mib * MIB
    top = _align_up(ram_top, window) + window
    sized = MmioWindow(
        bar_bytes=end,
        window_mib=window_mib,
        args=f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={window_mib}",
        phys_bits=(top - 1).bit_length(),
    )
    if strategy == "args":
        return _override(sized, host_phys_bits)
    return _dynamic(sized, ram_top, host_phys_bits, qemu_server)


def mmio_refusal(strategy: MmioStrategy, root_user: str | None) -> str | None:
    """Why `strategy` cannot be applied when root-only keys are written by `root_user` (`root@pam`, or None:
    no root path, `PveApiSpec.root_user`); None if it can. Inventory validation refuses it first."""
    if strategy == "args" and root_user != ROOT_USER:
        return (
            "the 64-bit MMIO window is set through the VM's `args` (OVMF X-PciMmio64Mb), which only "
            "root@pam can set, and pvegpu has no root path to the node: let pvegpu reach it as root over "
            "SSH (pve.root_ssh: true), or set vm.mmio to 'phys-bits'"
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


def _override(sized: MmioWindow, host_bits: int | None) -> MmioWindow:
    """`vm.mmio: args`: X-PciMmio64Mb's window, placed above RAM within the firmware's width."""
    size, bars, bits = _size(sized.window_mib * MIB), _size(sized.bar_bytes), sized.phys_bits
    what = (
        f"64-bit MMIO window {size} (vm.mmio args: X-PciMmio64Mb={sized.window_mib}) for {bars} of GPU BARs"
    )
    if sized.window_mib > OVMF_OVERRIDE_MAX_MIB:
        return _refused(
            sized,
            what,
            f"the GPUs' BARs ({bars}) need a 64-bit MMIO window of {size}, and OVMF ignores an X-PciMmio64Mb "
            f"above {OVMF_OVERRIDE_MAX_MIB} (16 TiB)",
        )
    width = _firmware_bits(host_bits)
    if width is None:
        return _planned(sized, "host", f"{what}, ending at 2^{bits}; {_UNKNOWN_WIDTH}")
    if bits > width:
        return _refused(
            sized,
            what,
            f"the 64-bit MMIO window of {size} (X-PciMmio64Mb) for the GPUs' BARs ({bars}) sits above the "
            f"VM's RAM and ends at 2^{bits}, beyond the 2^{width} the guest's firmware addresses "
            f"({_width_why(host_bits)})",
        )
    return _planned(
        sized,
        "host",
        f"{what}, ending at 2^{bits} within the guest firmware's 2^{width} ({_width_why(host_bits)})",
    )


def _dynamic(
    sized: MmioWindow, ram_top: int, host_bits: int | None, qemu_server: tuple[int, int, int] | None
) -> MmioWindow:
    """`vm.mmio: phys-bits`: OVMF's own window, from guest-phys-bits where qemu-server has it, else from the
    host's width."""
    needed, bars = sized.window_mib * MIB, _size(sized.bar_bytes)
    if qemu_server is not None and qemu_server >= GUEST_PHYS_BITS_SINCE:
        bits = _guest_phys_bits(needed, ram_top)
        cpu = f"host,guest-phys-bits={bits}"
        window = _size(1 << (bits - 3))
        what = (
            f"64-bit MMIO window {window} (OVMF's top eighth of 2^{bits}: cpu {cpu}) for {bars} of GPU BARs"
        )
        limit = OVMF_MAX_BITS if host_bits is None else min(host_bits, OVMF_MAX_BITS)
        if bits > limit:
            why = (
                f"the host CPU's {host_bits} address bits (QEMU refuses more)"
                if host_bits is not None and host_bits < OVMF_MAX_BITS
                else f"OVMF's {OVMF_MAX_BITS} (4-level paging)"
            )
            return _refused(
                sized,
                what,
                f"the GPUs' BARs ({bars}) need a 64-bit MMIO window of {_size(needed)}: guest-phys-bits "
                f"{bits}, above {why}: set vm.mmio to args (root@pam)",
            )
        return _planned(sized, cpu, what)
    without = (
        "qemu-server's version is not known, so no guest-phys-bits"
        if qemu_server is None
        else f"qemu-server {'.'.join(map(str, qemu_server))} has no guest-phys-bits (9.0.18+)"
    )
    width = _firmware_bits(host_bits)
    if width is None:
        return _planned(
            sized,
            "host",
            f"64-bit MMIO window: OVMF's top eighth of the host's address width ({without}); "
            f"{_UNKNOWN_WIDTH}",
        )
    got = 1 << (width - 3)
    what = (
        f"64-bit MMIO window {_size(got)} (OVMF's top eighth of 2^{width}, cpu host: "
        f"{_width_why(host_bits)}; {without}) for {bars} of GPU BARs"
    )
    if not _dynamic_holds(width, needed, ram_top):
        return _refused(
            sized,
            what,
            f"the GPUs' BARs ({bars}) need a 64-bit MMIO window of {_size(needed)}; with vm.mmio phys-bits "
            f"the guest gets OVMF's {_size(got)} (2^({width}-3), cpu host: {_width_why(host_bits)}; QEMU "
            f"ignores phys-bits with cpu host, and {without}): set vm.mmio to args (root@pam)",
        )
    return _planned(sized, "host", what)


_UNKNOWN_WIDTH = "the host CPU's address width is not known (no `address sizes` in /proc/cpuinfo)"


def _planned(sized: MmioWindow, cpu: str, guest: str) -> MmioWindow:
    return MmioWindow(sized.bar_bytes, sized.window_mib, sized.args, sized.phys_bits, cpu, guest)


def _refused(sized: MmioWindow, guest: str, problem: str) -> MmioWindow:
    return MmioWindow(sized.bar_bytes, sized.window_mib, sized.args, sized.phys_bits, "host", guest, problem)


def _firmware_bits(host_bits: int | None) -> int | None:
    """The address width OVMF uses with `cpu: host` and no guest-phys-bits (KVM's own GuestPhysBits is the
    host's, or 48 with 4-level TDP: arch/x86/kvm/cpuid.c, never below OVMF's cap)."""
    return None if host_bits is None else min(host_bits, OVMF_MAX_BITS)


def _width_why(host_bits: int | None) -> str:
    return f"the host CPU's {host_bits} address bits, OVMF's 4-level paging at most {OVMF_MAX_BITS}"


def _guest_phys_bits(needed: int, ram_top: int) -> int:
    """The smallest guest-phys-bits whose OVMF window (2^(bits-3)) holds `needed` bytes with RAM below it."""
    bits = QEMU_MIN_GUEST_PHYS_BITS
    while not _dynamic_holds(bits, needed, ram_top):
        bits += 1
    return bits


def _dynamic_holds(bits: int, needed: int, ram_top: int) -> bool:
    """Whether OVMF's dynamic window of a `bits` wide address space is used and holds `needed` bytes:
    PlatformDynamicMmioWindow takes it when it is larger than the default window and the default window's
    base (above RAM, 32 GiB aligned: PlatformGetFirstNonAddress) plus it stays below the space's end."""
    space, window = 1 << bits, 1 << (bits - 3)
    base = _align_up(_align_up(ram_top, GIB), OVMF_DEFAULT_WINDOW)
    return window > OVMF_DEFAULT_WINDOW and base + window < space and window >= needed


def _size(size: int) -> str:
    """`size` bytes in the largest binary unit that divides it: `4 TiB`, `128 GiB`, `1966112 MiB`."""
    for unit, name in ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB")):
        if size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} bytes"
