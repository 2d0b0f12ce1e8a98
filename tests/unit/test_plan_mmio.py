"""The 64-bit MMIO window from BAR sizes, on the reference box (lab.fakesys: RTX PRO 6000 BAR1 128 GiB,
BAR3 32 MiB, audio function without 64-bit BARs) and on hand-made BAR sets."""

from __future__ import annotations

import pytest

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.hardware import Bar, PciFunction
from pvegpu.models.inventory import GpuSelector
from pvegpu.plan.mmio import MmioWindow, mmio_refusal, passed_functions, plan_mmio
from pvegpu.plan.topology import plan_topology

GIB, MIB = 1 << 30, 1 << 20


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[list[PciFunction]]:
    root = tmp_path_factory.mktemp("sys") / "reference"
    write_tree(root, "reference")
    hw = read_hardware_locally(root)
    return passed_functions(hw, plan_topology(hw, GpuSelector(ids=("10de:2bb1",))).gpus)


def test_reference_eight_cards(reference: list[list[PciFunction]]) -> None:
    """Each card's root port window (128 GiB + 32 MiB) is aligned to 128 GiB, so it takes a 256 GiB slot:
    7 x 256 GiB + 128 GiB + 32 MiB, rounded to 2 TiB, doubled: 4 TiB. RAM 128 GiB + the window: 43 bits."""
    assert [f.address for f in reference[0]] == ["0000:41:00.0", "0000:41:00.1"]
    assert plan_mmio(reference, memory_mib=131072) == MmioWindow(
        bar_bytes=7 * 256 * GIB + 128 * GIB + 32 * MIB,
        window_mib=4194304,
        args="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=4194304",
        phys_bits=43,
    )


def test_reference_one_card(reference: list[list[PciFunction]]) -> None:
    assert plan_mmio(reference[:1], memory_mib=65536) == MmioWindow(
        bar_bytes=128 * GIB + 32 * MIB,
        window_mib=524288,
        args="-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288",
        phys_bits=40,
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


def test_error_nothing_to_size() -> None:
    with pytest.raises(ValueError, match=r"^no 64-bit prefetchable BAR among the passed functions$"):
        plan_mmio([[function(bar(0, 16 * MIB, is_64bit=False))]], memory_mib=1024)


def test_mmio_refusal() -> None:
    assert mmio_refusal("args", "root@pam") is None
    assert mmio_refusal("phys-bits", "pvegpu@pve!deploy") is None
    assert mmio_refusal("args", "pvegpu@pve!deploy") == (
        "the 64-bit MMIO window is set through the VM's `args` (OVMF X-PciMmio64Mb), which only root@pam can "
        "set, and the API is used as pvegpu@pve!deploy: use root@pam, or set vm.mmio to 'phys-bits'"
    )


def test_passed_functions_are_the_whole_slot(reference: list[list[PciFunction]]) -> None:
    """The HDMI audio function goes along; its only BAR is 32-bit, so it adds nothing to the window."""
    assert [len(card) for card in reference] == [2] * 8
    assert [(b.index, b.size, b.is_64bit) for b in reference[0][1].bars] == [(0, 0x4000, False)]
