"""The 64-bit MMIO window from BAR sizes, on the reference box (lab.fakesys: RTX PRO 6000 BAR1 128 GiB,
BAR3 32 MiB, audio function without 64-bit BARs) and on hand-made BAR sets."""

from __future__ import annotations

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.hardware import Bar, PciFunction
from pvegpu.models.node import GpuSelector
from pvegpu.plan.mmio import MmioWindow, mmio_refusal, passed_functions, plan_mmio
from pvegpu.plan.topology import plan_topology

GIB, MIB = 1 << 30, 1 << 20


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[list[PciFunction]]:
    root = tmp_path_factory.mktemp("sys") / "reference"
    write_tree(root, "reference")
    hw = read_hardware_locally(root)
    return passed_functions(hw, plan_topology(hw, GpuSelector(ids=("10de:2bb1",))).gpus)


# The reference box's CPU: AMD EPYC 9004 (Genoa) reports 52 physical address bits (/proc/cpuinfo
# `address sizes : 52 bits physical, 57 bits virtual`); the reference VM has 128 GiB of RAM.
EPYC_BITS = 52
BARS = "1966112 MiB"  # 7 x 256 GiB + 128 GiB + 32 MiB
WIDTH = "the host CPU's 52 address bits, OVMF's 4-level paging at most 46"


def test_reference_eight_cards(reference: list[list[PciFunction]]) -> None:
    """Each card's root port window (128 GiB + 32 MiB) is aligned to 128 GiB, so it takes a 256 GiB slot:
    7 x 256 GiB + 128 GiB + 32 MiB, rounded to 2 TiB, doubled: 4 TiB. RAM 128 GiB + the window: 43 bits,
    within the 46 OVMF addresses on a 52-bit host."""
    assert [f.address for f in reference[0]] == ["0000:41:00.0", "0000:41:00.1"]
    assert plan_mmio(reference, memory_mib=131072, strategy="args", host_phys_bits=EPYC_BITS) == MmioWindow(
        bar_bytes=7 * 256 * GIB + 128 * GIB + 32 * MIB,
        window_mib=4194304,
        args="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=4194304",
        phys_bits=43,
        cpu="host",
        guest=(
            f"64-bit MMIO window 4 TiB (vm.mmio args: X-PciMmio64Mb=4194304) for {BARS} of GPU BARs, ending "
            f"at 2^43 within the guest firmware's 2^46 ({WIDTH})"
        ),
    )


def test_reference_guest_phys_bits_where_qemu_server_has_it(reference: list[list[PciFunction]]) -> None:
    """qemu-server 9.0.18+: the smallest guest-phys-bits whose OVMF window 2^(N-3) holds 4 TiB: 45."""
    window = plan_mmio(reference, 131072, "phys-bits", EPYC_BITS, (9, 2, 6))
    assert (window.cpu, window.guest, window.problem) == (
        "host,guest-phys-bits=45",
        f"64-bit MMIO window 4 TiB (OVMF's top eighth of 2^45: cpu host,guest-phys-bits=45) for {BARS} of "
        "GPU BARs",
        None,
    )
    assert plan_mmio(reference, 131072, "phys-bits", EPYC_BITS, (9, 0, 18)).cpu == "host,guest-phys-bits=45"


def test_reference_host_phys_bits_before_guest_phys_bits(reference: list[list[PciFunction]]) -> None:
    """qemu-server 9.0.17: `cpu: host` (phys-bits=N would be ignored): OVMF's 2^(min(52, 46)-3) = 8 TiB."""
    window = plan_mmio(reference, 131072, "phys-bits", EPYC_BITS, (9, 0, 17))
    assert (window.cpu, window.guest, window.problem) == (
        "host",
        f"64-bit MMIO window 8 TiB (OVMF's top eighth of 2^46, cpu host: {WIDTH}; qemu-server 9.0.17 has no "
        f"guest-phys-bits (9.0.18+)) for {BARS} of GPU BARs",
        None,
    )


def test_error_host_width_too_small_without_guest_phys_bits(reference: list[list[PciFunction]]) -> None:
    """A CPU with 43 address bits (as /proc/cpuinfo shows an EPYC with SME on) gives OVMF's 1 TiB."""
    window = plan_mmio(reference, 131072, "phys-bits", 43, None)
    assert (window.cpu, window.problem) == (
        "host",
        f"the GPUs' BARs ({BARS}) need a 64-bit MMIO window of 4 TiB; with vm.mmio phys-bits the guest gets "
        "OVMF's 1 TiB (2^(43-3), cpu host: the host CPU's 43 address bits, OVMF's 4-level paging at most 46; "
        "QEMU ignores phys-bits with cpu host, and qemu-server's version is not known, so no "
        "guest-phys-bits): set vm.mmio to args (root@pam)",
    )


def test_error_guest_phys_bits_above_the_host(reference: list[list[PciFunction]]) -> None:
    window = plan_mmio(reference, 131072, "phys-bits", 43, (9, 2, 6))
    assert window.problem == (
        f"the GPUs' BARs ({BARS}) need a 64-bit MMIO window of 4 TiB: guest-phys-bits 45, above the host "
        "CPU's 43 address bits (QEMU refuses more): set vm.mmio to args (root@pam)"
    )


def test_error_args_window_beyond_the_firmware_width(reference: list[list[PciFunction]]) -> None:
    window = plan_mmio(reference, 131072, "args", 42)
    assert window.problem == (
        f"the 64-bit MMIO window of 4 TiB (X-PciMmio64Mb) for the GPUs' BARs ({BARS}) sits above the VM's "
        "RAM and ends at 2^43, beyond the 2^42 the guest's firmware addresses (the host CPU's 42 address "
        "bits, OVMF's 4-level paging at most 46)"
    )


def test_unknown_host_width_is_said(reference: list[list[PciFunction]]) -> None:
    window = plan_mmio(reference, 131072)
    assert (window.problem, window.guest) == (
        None,
        f"64-bit MMIO window 4 TiB (vm.mmio args: X-PciMmio64Mb=4194304) for {BARS} of GPU BARs, ending at "
        "2^43; the host CPU's address width is not known (no `address sizes` in /proc/cpuinfo)",
    )


def test_reference_one_card(reference: list[list[PciFunction]]) -> None:
    window = plan_mmio(reference[:1], memory_mib=65536, strategy="phys-bits", qemu_server=(9, 2, 6))
    assert (window.bar_bytes, window.window_mib, window.args, window.phys_bits, window.cpu) == (
        128 * GIB + 32 * MIB,
        524288,
        "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288",
        40,
        "host,guest-phys-bits=42",
    )


def function(*bars: Bar) -> PciFunction:
    return PciFunction(
        "0000:01:00.0", "10de", "2204", "0000", "0000", 0x030000, None, 1, None, "0000:00", bars=bars
    )


def bar(index: int, size: int, *, is_64bit: bool = True, prefetchable: bool = True) -> Bar:
    return Bar(index, 0, size, is_64bit, prefetchable, False)


def test_only_64bit_prefetchable_bars_count() -> None:
    card = [
        function(
            bar(0, 16 * MIB, is_64bit=False, prefetchable=False),
            bar(1, 8 * GIB),
            bar(3, 32 * MIB),
            bar(5, 64 * MIB, prefetchable=False),
            bar(6, 512 * 1024, is_64bit=False),  # expansion ROM
        )
    ]
    window = plan_mmio([card], memory_mib=16384)
    assert (window.bar_bytes, window.window_mib) == (8 * GIB + 32 * MIB, 32768)


def test_error_x_pcimmio64mb_above_16_tib() -> None:
    """OVMF takes X-PciMmio64Mb up to 0x1000000 MiB (16 TiB; MemDetect.c PlatformGetFirstNonAddress): 8 cards
    of 1 TiB need exactly that, 9 need 32 TiB, which OVMF ignores."""
    card = [function(bar(1, 1 << 40))]
    assert plan_mmio([card] * 8, memory_mib=65536, host_phys_bits=52).problem is None
    window = plan_mmio([card] * 9, memory_mib=65536, host_phys_bits=52)
    assert (window.window_mib, window.problem) == (
        33554432,
        "the GPUs' BARs (9 TiB) need a 64-bit MMIO window of 32 TiB, and OVMF ignores an X-PciMmio64Mb above "
        "16777216 (16 TiB)",
    )


def test_guest_phys_bits_leave_room_for_ram() -> None:
    """A 16 GiB BAR needs 32 GiB; OVMF takes its own window only above its 32 GiB default: 2^39 (64 GiB).
    With 4 TiB of RAM the top eighth of 2^39..2^42 would start below RAM's end: 2^43."""
    card = [function(bar(1, 16 * GIB))]
    assert plan_mmio([card], memory_mib=4 << 20, strategy="phys-bits", qemu_server=(9, 2, 6)).cpu == (
        "host,guest-phys-bits=43"
    )
    assert plan_mmio([card], memory_mib=16384, strategy="phys-bits", qemu_server=(9, 2, 6)).cpu == (
        "host,guest-phys-bits=39"
    )


def test_error_nothing_to_size() -> None:
    with pytest.raises(ValueError, match=r"^no 64-bit prefetchable BAR among the passed functions$"):
        plan_mmio([[function(bar(0, 16 * MIB, is_64bit=False))]], memory_mib=1024)


def test_mmio_refusal() -> None:
    """`root_user`: PveApiSpec.root_user (root@pam, also for a token with pve.root_ssh; None without)."""
    assert mmio_refusal("args", "root@pam") is None
    assert mmio_refusal("phys-bits", None) is None
    assert mmio_refusal("args", None) == (
        "the 64-bit MMIO window is set through the VM's `args` (OVMF X-PciMmio64Mb), which only root@pam can "
        "set, and pvegpu has no root path to the node: let pvegpu reach it as root over SSH "
        "(pve.root_ssh: true), or set vm.mmio to 'phys-bits'"
    )


def test_passed_functions_are_the_whole_slot(reference: list[list[PciFunction]]) -> None:
    """The HDMI audio function goes along; its only BAR is 32-bit, so it adds nothing to the window."""
    assert [len(card) for card in reference] == [2] * 8
    assert [(b.index, b.size, b.is_64bit) for b in reference[0][1].bars] == [(0, 0x4000, False)]
