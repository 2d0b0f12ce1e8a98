"""The lab's named boxes, written in `lab.topology`'s language. Synthetic: built to resemble real hardware,
never captured from a machine; their IOMMU groups are computed by `lab.grouping`, not written down.

- `reference`: the design's box. 2-socket AMD EPYC (Genoa-class, PCIe 5.0), 8 NVIDIA RTX PRO 6000 Blackwell
  cards (GPU + HDMI audio), each behind a root port of its own root complex, 4 per NUMA node. Host I/O
  (dual-port NIC, NVMe, USB, the BMC's VGA behind its PCIe-to-PCI bridge) on root complexes 00 and 80.
  gpu0 is 0000:41:00 (root bus 0000:40, NUMA 0).
- `reference-renumbered`: the same cards in the same slots after a BIOS change: root buses re-allocated
  (0000:41:00 is now gpu2, not gpu0) and a second NVMe enabled on root complex 00, so every group number
  after it moves.
- `reference-missing-gpu`: the reference box with the card of slot 4 (gpu3, 0000:71:00) gone, its root port
  empty: the buses stay, and every group probed after that card's is one lower.
- `reference-other-card`: the reference box with an RTX 6000 Ada (10de:26b1, an assumed subsystem 10de:16a1)
  in slot 6 (gpu5, 0000:d1:00) instead of the RTX PRO 6000: same address, same groups.
- `switches`: GPUs in pairs behind Broadcom PCIe switches (one per root complex), downstream ports with
  ACS: each card alone in its group.
- `switches-noacs`: the same, downstream ports without ACS: each card shares its group with its
  downstream port (a bridge, which VFIO tolerates).
- `shared-with-nic`: the reference box, but gpu3 sits behind a switch together with a NIC, and the root port
  feeding that switch has ACS disabled: GPU, audio, NIC and all the bridges share one group.
- `qemu-probe`: the layouts of shared/fixtures/real-kernel (QEMU q35: root ports, a pxb-pcie root complex,
  x3130 switches under root ports with and without ACS, multifunction root ports with and without ACS),
  as described to QEMU, without what q35 adds by itself (see lab.kernel.qemu.realize).

Device ids: NVIDIA ones as given for the reference box; AMD root complex 1022:14a4 (arch/x86/kernel/amd_nb.c),
IOMMU 1022:149e and root port 1022:14ab (seen in public hardware listings and kernel mails); the dummy host
bridge id 1022:149f is assumed. Others: common server parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.topology import Bar, Device, Function, Kind, Link, RootComplex, Space, Topology

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

GEN5_X16 = Link("32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16)
GEN4_X16 = Link("16.0 GT/s PCIe", 16, "16.0 GT/s PCIe", 16)
GEN5_CARD_ON_GEN4 = Link("16.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16)
GEN4_X4 = Link("16.0 GT/s PCIe", 4, "16.0 GT/s PCIe", 4)
GEN2_X1 = Link("5.0 GT/s PCIe", 1, "5.0 GT/s PCIe", 1)

NUMA_CPULISTS = {0: "0-31,64-95", 1: "32-63,96-127"}  # 2 x 32 cores with SMT

NVIDIA = 0x10DE
AMD = 0x1022


@dataclass(frozen=True)
class CardModel:
    """An NVIDIA card's two functions (display + HDMI audio, one subsystem) and its BAR0/BAR1 sizes."""

    device: int
    audio: int
    subsystem: tuple[int, int]
    bar0: int
    bar1: int


# RTX PRO 6000 Blackwell (96 GB): BAR1 128 GiB, the 96 GB card's large BAR.
RTX_PRO_6000 = CardModel(0x2BB1, 0x22E8, (NVIDIA, 0x204B), bar0=64 * MIB, bar1=128 * GIB)
# RTX 6000 Ada (48 GB), AD102: its audio 10de:22ba; the subsystem 10de:16a1 is assumed.
RTX_6000_ADA = CardModel(0x26B1, 0x22BA, (NVIDIA, 0x16A1), bar0=16 * MIB, bar1=64 * GIB)


def gpu_card(
    dev: int = 0, *, slot: str | None = None, link: Link = GEN5_X16, model: CardModel = RTX_PRO_6000
) -> Device:
    """An NVIDIA card: BAR0 (32-bit), BAR1 (64-bit prefetchable), BAR3 32 MiB, IO; then its audio function."""
    gpu = Function(
        fn=0,
        vendor=NVIDIA,
        device=model.device,
        class_code=0x030000,
        kind=Kind.ENDPOINT,
        subsystem=model.subsystem,
        revision=0xA1,
        link=link,
        driver="nvidia",
        rom_size=512 * KIB,
        bars=(
            Bar(0, model.bar0, Space.MEM32),
            Bar(1, model.bar1, Space.MEM64, prefetchable=True),
            Bar(3, 32 * MIB, Space.MEM64, prefetchable=True),
            Bar(5, 128, Space.IO),
        ),
    )
    audio = Function(
        fn=1,
        vendor=NVIDIA,
        device=model.audio,
        class_code=0x040300,
        kind=Kind.ENDPOINT,
        subsystem=model.subsystem,
        revision=0xA1,
        link=link,
        driver="snd_hda_intel",
        bars=(Bar(0, 16 * KIB, Space.MEM32),),
    )
    return Device(dev, (gpu, audio), slot=slot)


def nic(dev: int = 0, *, ports: int = 2, slot: str | None = None) -> Device:
    """NVIDIA/Mellanox ConnectX-6 Dx; its port functions have no ACS, so they share a group."""
    return Device(
        dev,
        tuple(
            Function(
                fn=fn,
                vendor=0x15B3,
                device=0x101D,
                class_code=0x020000,
                kind=Kind.ENDPOINT,
                subsystem=(0x15B3, 0x0016),
                link=GEN4_X16,
                driver="mlx5_core",
                bars=(Bar(0, 32 * MIB, Space.MEM64, prefetchable=True),),
            )
            for fn in range(ports)
        ),
        slot=slot,
    )


def nvme(dev: int = 0) -> Device:
    """Samsung PM9A3 U.2 SSD."""
    return Device(
        dev,
        (
            Function(
                fn=0,
                vendor=0x144D,
                device=0xA80A,
                class_code=0x010802,
                kind=Kind.ENDPOINT,
                subsystem=(0x144D, 0xA812),
                link=GEN4_X4,
                driver="nvme",
                bars=(Bar(0, 16 * KIB, Space.MEM64),),
            ),
        ),
    )


def usb(dev: int = 0) -> Device:
    """Renesas uPD720201 xHCI controller."""
    return Device(
        dev,
        (
            Function(
                fn=0,
                vendor=0x1912,
                device=0x0014,
                class_code=0x0C0330,
                kind=Kind.ENDPOINT,
                subsystem=(0x1912, 0x0014),
                revision=0x03,
                link=GEN2_X1,
                driver="xhci_hcd",
                bars=(Bar(0, 8 * KIB, Space.MEM64),),
            ),
        ),
    )


def bmc_vga(dev: int = 0) -> Device:
    """ASPEED AST2600 BMC: its VGA (class 0x030000, a display that is not a GPU to pass through) sits on a
    conventional PCI bus behind the BMC's own PCIe-to-PCI bridge, so both share a group (DMA alias)."""
    vga = Function(
        fn=0,
        vendor=0x1A03,
        device=0x2000,
        class_code=0x030000,
        kind=Kind.CONVENTIONAL,
        subsystem=(0x1A03, 0x2000),
        revision=0x52,
        driver="ast",
        bars=(
            Bar(0, 64 * MIB, Space.MEM32, prefetchable=True),
            Bar(1, 256 * KIB, Space.MEM32),
            Bar(2, 128, Space.IO),
        ),
    )
    bridge = Function(
        fn=0,
        vendor=0x1A03,
        device=0x1150,
        class_code=0x060400,
        kind=Kind.PCI_BRIDGE,
        revision=0x06,
        link=GEN2_X1,
        children=(Device(0, (vga,)),),
    )
    return Device(dev, (bridge,))


def root_port(fn: int, child: Device | None, *, acs: bool = True, link: Link = GEN5_X16) -> Function:
    """An AMD GPP bridge (root port), empty when `child` is None. Real AMD root ports have ACS; `acs=False` is
    a BIOS that disabled it."""
    return Function(
        fn=fn,
        vendor=AMD,
        device=0x14AB,
        class_code=0x060400,
        kind=Kind.ROOT_PORT,
        acs=acs,
        link=link,
        driver="pcieport",
        children=(child,) if child else (),
    )


def amd_root_complex(bus: int, numa: int, ports: dict[int, tuple[Function, ...]]) -> RootComplex:
    """An AMD root complex: its host bridge (00.0) and IOMMU (00.2), which have no IOMMU group, then for
    each device number in `ports` a dummy host bridge (dev.0) beside the root ports (dev.1, dev.2, ...)."""
    host = Function(
        fn=0,
        vendor=AMD,
        device=0x14A4,
        class_code=0x060000,
        kind=Kind.CONVENTIONAL,
        subsystem=(AMD, 0x14A4),
        iommu_scope=False,
    )
    iommu = Function(
        fn=2,
        vendor=AMD,
        device=0x149E,
        class_code=0x080600,
        kind=Kind.ENDPOINT,
        subsystem=(AMD, 0x149E),
        iommu_scope=False,
    )
    devices = [Device(0, (host, iommu))]
    for dev, functions in sorted(ports.items()):
        dummy = Function(fn=0, vendor=AMD, device=0x149F, class_code=0x060000, kind=Kind.CONVENTIONAL)
        devices.append(Device(dev, (dummy, *functions)))
    return RootComplex(bus=bus, numa=numa, devices=tuple(devices))


def switch(downstream: tuple[Device, ...], *, acs: bool, link: Link = GEN4_X16, dev: int = 0) -> Device:
    """A Broadcom PEX88000 PCIe switch: upstream port, one downstream port per device in `downstream`."""
    ports = tuple(
        Device(
            n,
            (
                Function(
                    fn=0,
                    vendor=0x1000,
                    device=0xC010,
                    class_code=0x060400,
                    kind=Kind.DOWNSTREAM,
                    acs=acs,
                    revision=0xB0,
                    link=link,
                    driver="pcieport",
                    children=(child,),
                ),
            ),
        )
        for n, child in enumerate(downstream)
    )
    upstream = Function(
        fn=0,
        vendor=0x1000,
        device=0xC010,
        class_code=0x060400,
        kind=Kind.UPSTREAM,
        revision=0xB0,
        link=link,
        driver="pcieport",
        children=ports,
    )
    return Device(dev, (upstream,))


def _host_io(*, second_nvme: bool = False) -> RootComplex:
    ports: dict[int, tuple[Function, ...]] = {
        1: (root_port(1, nic(slot="9"), link=GEN4_X16),),
        3: (root_port(1, nvme(), link=GEN4_X4),),
        5: (root_port(1, usb(), link=GEN2_X1),),
        7: (root_port(1, bmc_vga(), link=GEN2_X1),),
    }
    if second_nvme:
        ports[3] = (*ports[3], root_port(2, nvme(), link=GEN4_X4))
    return amd_root_complex(0x00, 0, ports)


def _reference(
    name: str,
    summary: str,
    gpu_buses: tuple[int, ...],
    host1_bus: int,
    *,
    second_nvme: bool = False,
    shared_card: int | None = None,
    missing_card: int | None = None,
    other_card: int | None = None,
) -> Topology:
    rcs = [_host_io(second_nvme=second_nvme), amd_root_complex(host1_bus, 1, {1: (root_port(1, nvme()),)})]
    for index, bus in enumerate(gpu_buses):
        card: Device | None = gpu_card(
            slot=str(index + 1), model=RTX_6000_ADA if index == other_card else RTX_PRO_6000
        )
        if index == missing_card:
            card = None
        if index == shared_card:
            behind = switch((gpu_card(slot=str(index + 1), link=GEN5_CARD_ON_GEN4), nic(ports=1)), acs=False)
            rcs.append(
                amd_root_complex(bus, index // 4, {1: (root_port(1, behind, acs=False, link=GEN4_X16),)})
            )
        else:
            rcs.append(amd_root_complex(bus, index // 4, {1: (root_port(1, card),)}))
    rcs.sort(key=lambda rc: rc.bus)
    return Topology(name, summary, tuple(rcs), iommu="amd", cpulists=NUMA_CPULISTS)


def _switches(name: str, summary: str, *, acs: bool) -> Topology:
    rcs = [_host_io(), amd_root_complex(0x80, 1, {1: (root_port(1, nvme()),)})]
    for pair, bus in enumerate((0x40, 0x60, 0xC0, 0xE0)):
        cards = tuple(gpu_card(slot=str(2 * pair + k + 1), link=GEN5_CARD_ON_GEN4) for k in range(2))
        rcs.append(
            amd_root_complex(bus, pair // 2, {1: (root_port(1, switch(cards, acs=acs), link=GEN4_X16),)})
        )
    rcs.sort(key=lambda rc: rc.bus)
    return Topology(name, summary, tuple(rcs), iommu="amd", cpulists=NUMA_CPULISTS)


def qemu_root_port(fn: int, child: Device | None, *, acs: bool = True) -> Function:
    """QEMU's pcie-root-port (1b36:000c); `acs=False` is disable-acs=on."""
    return Function(
        fn=fn,
        vendor=0x1B36,
        device=0x000C,
        class_code=0x060400,
        kind=Kind.ROOT_PORT,
        acs=acs,
        children=(child,) if child else (),
    )


def _qemu(vendor: int, device: int, class_code: int, *, fn: int = 0, kind: Kind = Kind.ENDPOINT) -> Function:
    return Function(fn=fn, vendor=vendor, device=device, class_code=class_code, kind=kind)


def _qemu_switch(*children: Device) -> Device:
    """QEMU's x3130-upstream with xio3130-downstream ports, which have no ACS capability."""
    ports = tuple(
        Device(
            n,
            (
                Function(
                    fn=0,
                    vendor=0x104C,
                    device=0x8233,
                    class_code=0x060400,
                    kind=Kind.DOWNSTREAM,
                    children=(child,),
                ),
            ),
        )
        for n, child in enumerate(children)
    )
    return Device(
        0,
        (
            Function(
                fn=0, vendor=0x104C, device=0x8232, class_code=0x060400, kind=Kind.UPSTREAM, children=ports
            ),
        ),
    )


def _qemu_probe() -> Topology:
    bochs = Device(0, (_qemu(0x1234, 0x1111, 0x038000),))
    gpu_audio = Device(0, (_qemu(0x1234, 0x1111, 0x038000), _qemu(0x8086, 0x293E, 0x040300, fn=1)))
    virtio_gpu = Device(0, (_qemu(0x1AF4, 0x1050, 0x038000),))
    e1000e = Device(0, (_qemu(0x8086, 0x10D3, 0x020000),))
    edu = Device(0, (_qemu(0x1234, 0x11E8, 0x00FF00),))
    pcie0 = RootComplex(
        bus=0x00,
        numa=None,
        devices=(
            Device(0x02, (qemu_root_port(0, gpu_audio),)),
            Device(0x03, (qemu_root_port(0, virtio_gpu),)),
            Device(0x04, (qemu_root_port(0, e1000e),)),
            Device(0x05, (qemu_root_port(0, edu),)),
            Device(0x07, (qemu_root_port(0, _qemu_switch(bochs, e1000e)),)),
            Device(0x08, (qemu_root_port(0, edu, acs=False), qemu_root_port(1, bochs, acs=False))),
            Device(0x09, (qemu_root_port(0, edu), qemu_root_port(1, bochs))),
            Device(0x0A, (qemu_root_port(0, _qemu_switch(bochs, bochs), acs=False),)),
        ),
    )
    pxb = RootComplex(
        bus=0x80, numa=None, devices=(Device(0x00, (qemu_root_port(0, bochs),)),), qemu_addr=0x06
    )
    return Topology(
        "qemu-probe",
        "the layouts of shared/fixtures/real-kernel as given to QEMU q35 (intel-iommu)",
        (pcie0, pxb),
        iommu="intel",
    )


TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        _reference(
            "reference",
            "2-socket AMD EPYC, 8 RTX PRO 6000 Blackwell, each behind a root port of its own root complex",
            gpu_buses=(0x40, 0x50, 0x60, 0x70, 0xC0, 0xD0, 0xE0, 0xF0),
            host1_bus=0x80,
        ),
        _reference(
            "reference-renumbered",
            "the reference box after a BIOS change: new bus and group numbers, same cards in the same slots",
            gpu_buses=(0x20, 0x30, 0x40, 0x50, 0xA0, 0xB0, 0xC0, 0xD0),
            host1_bus=0x80,
            second_nvme=True,
        ),
        _switches("switches", "GPUs in pairs behind PCIe switches whose downstream ports have ACS", acs=True),
        _switches(
            "switches-noacs",
            "GPUs in pairs behind PCIe switches without ACS on the downstream ports",
            acs=False,
        ),
        _reference(
            "shared-with-nic",
            "the reference box, but gpu3 shares its IOMMU group with a NIC behind a switch (no ACS above)",
            gpu_buses=(0x40, 0x50, 0x60, 0x70, 0xC0, 0xD0, 0xE0, 0xF0),
            host1_bus=0x80,
            shared_card=3,
        ),
        _reference(
            "reference-missing-gpu",
            "the reference box with the card of slot 4 (gpu3) gone: same buses, later groups one lower",
            gpu_buses=(0x40, 0x50, 0x60, 0x70, 0xC0, 0xD0, 0xE0, 0xF0),
            host1_bus=0x80,
            missing_card=3,
        ),
        _reference(
            "reference-other-card",
            "the reference box with an RTX 6000 Ada (10de:26b1) in slot 6 (gpu5) instead of its RTX PRO 6000",
            gpu_buses=(0x40, 0x50, 0x60, 0x70, 0xC0, 0xD0, 0xE0, 0xF0),
            host1_bus=0x80,
            other_card=5,
        ),
        _qemu_probe(),
    )
}
