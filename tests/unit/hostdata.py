"""Synthesized HostHardware for the host-role tests: two identical RTX PRO 6000 cards (GPU + HDMI audio)
behind root ports, in groups of their own, plus a NIC. Shapes follow the reference box (lab.topologies)."""

from __future__ import annotations

from typing import Any

from pvegpu.facts.pvegpu_boot import BootFiles
from pvegpu.models.hardware import HostHardware, PciFunction

RTX = "10de:2bb1"
AUDIO = "10de:22e8"


def fn(
    address: str,
    ids: str,
    cls: int,
    *,
    group: int,
    driver: str | None,
    root_bus: str,
    parents: tuple[str, ...] = (),
) -> PciFunction:
    vendor, device = ids.split(":")
    return PciFunction(
        address=address,
        vendor=vendor,
        device=device,
        subsystem_vendor="10de",
        subsystem_device="204b",
        class_code=cls,
        driver=driver,
        iommu_group=group,
        numa_node=0,
        root_bus=root_bus,
        parents=parents,
    )


def two_cards(driver: str | None = "nvidia", iommu: bool = True) -> HostHardware:
    """0000:41:00.{0,1} (group 14) and 0000:51:00.{0,1} (group 24), root ports 40:01.1 / 50:01.1."""
    audio_driver = driver if driver in (None, "vfio-pci") else "snd_hda_intel"
    functions = []
    for bus, group in (("41", 14), ("51", 24)):
        root = f"0000:{int(bus) - 1}"
        port = (f"{root}:01.1",)
        functions += [
            fn(f"{root}:01.1", "1022:14ab", 0x060400, group=group - 1, driver="pcieport", root_bus=root),
            fn(f"0000:{bus}:00.0", RTX, 0x030000, group=group, driver=driver, root_bus=root, parents=port),
            fn(
                f"0000:{bus}:00.1",
                AUDIO,
                0x040300,
                group=group,
                driver=audio_driver,
                root_bus=root,
                parents=port,
            ),
        ]
    functions.append(fn("0000:61:00.0", "8086:1521", 0x020000, group=30, driver="igb", root_bus="0000:60"))
    return HostHardware(functions=tuple(functions), iommu_present=iommu)


def written_files(**changes: Any) -> BootFiles:
    """pvegpu's boot files as the `PvegpuBootFiles` fact reads them: none written, plus `changes`."""
    base: dict[str, Any] = {
        "kernel_cmdline": None,
        "backup": None,
        "grub_dropin": None,
        "owned_tokens": (),
        "modules_load": None,
        "modprobe": None,
    }
    return BootFiles(**{**base, **changes})
