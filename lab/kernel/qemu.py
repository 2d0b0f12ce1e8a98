"""The kernel tier's QEMU side: what a topology becomes on a q35 machine, and what the kernel said about it.

`realize(topology, iommu)` turns a description into the `-device` arguments of a TCG q35 guest AND into the
description of what that guest really contains, so `lab.grouping` can be run on exactly what the kernel
sees. What changes on the way, and why:

- q35 brings its own host bridge (00:00.0) and ICH9 functions (00:1f.0/2/3); each root complex other than
  bus 00 becomes a pxb-pcie expander (a host bridge function on bus 00 plus a root bus), and the kernel
  probes those root buses in DESCENDING bus order (measured: QEMU 7.2, Linux 6.1);
- functions outside the IOMMU's scope (an AMD root complex's own host bridge and IOMMU) are left out;
  with `iommu="amd"` QEMU adds its own IOMMU function (out of scope, first free slot of bus 00);
- only bridges may sit on a pxb-pcie bus, so an in-scope host bridge function (AMD's dummy host bridge)
  is stood in for by an empty root port without ACS, which groups as the dummy does (a function without
  ACS, with nothing below it);
- endpoints become QEMU models by class (bochs-display, ich9-intel-hda, e1000e, nvme, qemu-xhci, edu),
  without ACS (QEMU endpoints have none); a downstream port WITH ACS becomes a pcie-root-port under the
  switch's upstream port (the kernel's ACS and DMA-alias code treat root and downstream ports alike).

`parse_probe(text)` reads the guest's report (lab/kernel/init; the same format as
shared/fixtures/real-kernel). `python -m lab.kernel.qemu TOPOLOGY [intel|amd]` prints the arguments, one per
line, for lab/kernel/boot.sh.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from lab.topologies import TOPOLOGIES
from lab.topology import Device, Function, Kind, RootComplex, Topology, TopologyError

IOMMUS = ("intel", "amd")


@dataclass(frozen=True)
class Model:
    """A QEMU device model: its -device name and the identity the guest sees."""

    name: str
    vendor: int
    device: int
    class_code: int
    kind: Kind


ROOT_PORT = Model("pcie-root-port", 0x1B36, 0x000C, 0x060400, Kind.ROOT_PORT)
UPSTREAM = Model("x3130-upstream", 0x104C, 0x8232, 0x060400, Kind.UPSTREAM)
DOWNSTREAM = Model("xio3130-downstream", 0x104C, 0x8233, 0x060400, Kind.DOWNSTREAM)
PCI_BRIDGE = Model("pcie-pci-bridge", 0x1B36, 0x000E, 0x060400, Kind.PCI_BRIDGE)
DISPLAY = Model("bochs-display", 0x1234, 0x1111, 0x038000, Kind.ENDPOINT)
AUDIO = Model("ich9-intel-hda", 0x8086, 0x293E, 0x040300, Kind.ENDPOINT)
NIC = Model("e1000e", 0x8086, 0x10D3, 0x020000, Kind.ENDPOINT)
PCI_NIC = Model("e1000", 0x8086, 0x100E, 0x020000, Kind.CONVENTIONAL)
NVME = Model("nvme", 0x1B36, 0x0010, 0x010802, Kind.ENDPOINT)
USB = Model("qemu-xhci", 0x1B36, 0x000D, 0x0C0330, Kind.ENDPOINT)
OTHER = Model("edu", 0x1234, 0x11E8, 0x00FF00, Kind.ENDPOINT)
VIRTIO_GPU = Model("virtio-gpu-pci", 0x1AF4, 0x1050, 0x038000, Kind.ENDPOINT)
MODELS = {
    (m.vendor, m.device): m
    for m in (
        ROOT_PORT,
        UPSTREAM,
        DOWNSTREAM,
        PCI_BRIDGE,
        DISPLAY,
        AUDIO,
        NIC,
        PCI_NIC,
        NVME,
        USB,
        OTHER,
        VIRTIO_GPU,
    )
}

# What q35 (and pxb-pcie, amd-iommu) put on bus 00 by themselves.
Q35_HOST_BRIDGE = Device(
    0x00, (Function(fn=0, vendor=0x8086, device=0x29C0, class_code=0x060000, kind=Kind.CONVENTIONAL),)
)
ICH9 = Device(
    0x1F,
    (
        Function(fn=0, vendor=0x8086, device=0x2918, class_code=0x060100, kind=Kind.CONVENTIONAL),
        Function(fn=2, vendor=0x8086, device=0x2922, class_code=0x010601, kind=Kind.CONVENTIONAL),
        Function(fn=3, vendor=0x8086, device=0x2930, class_code=0x0C0500, kind=Kind.CONVENTIONAL),
    ),
)
PXB = Function(fn=0, vendor=0x1B36, device=0x000B, class_code=0x060000, kind=Kind.CONVENTIONAL)
AMD_IOMMU = Function(
    fn=0, vendor=0x1022, device=0x0008, class_code=0x080600, kind=Kind.ENDPOINT, iommu_scope=False
)


@dataclass(frozen=True)
class Realization:
    """`topology`: what the guest contains, root complexes in the kernel's probe order; `args`: the
    qemu-system-x86_64 arguments that build it (IOMMU device included)."""

    topology: Topology
    args: tuple[str, ...]


_BRIDGES = {
    Kind.ROOT_PORT: ROOT_PORT,
    Kind.DOWNSTREAM: DOWNSTREAM,
    Kind.UPSTREAM: UPSTREAM,
    Kind.PCI_BRIDGE: PCI_BRIDGE,
}
_ENDPOINTS_BY_CLASS = ((0x03, DISPLAY), (0x0403, AUDIO), (0x02, NIC), (0x0108, NVME), (0x0C03, USB))


def _model(function: Function, on_conventional_bus: bool) -> tuple[Model, bool]:
    """The QEMU model standing in for `function`, and whether it has ACS in the guest."""
    known = MODELS.get((function.vendor, function.device))
    if known is None and function.kind is Kind.DOWNSTREAM and function.acs:
        return ROOT_PORT, True
    if known is None and function.kind in _BRIDGES:
        known = _BRIDGES[function.kind]
    if known is not None:
        return known, function.acs and known.kind in (Kind.ROOT_PORT, Kind.DOWNSTREAM)
    if function.class_code >> 8 == 0x0600:  # a host bridge function in the IOMMU's scope (AMD's dummy)
        return ROOT_PORT, False
    for prefix, model in _ENDPOINTS_BY_CLASS:
        if function.class_code >> (16 if prefix <= 0xFF else 8) == prefix:
            return (PCI_NIC if model is NIC and on_conventional_bus else model), False
    return OTHER, False


class _Builder:
    def __init__(self) -> None:
        self.args: list[str] = []
        self.ids = 0
        self.chassis = 0

    def devices(self, devices: Sequence[Device], bus_id: str, conventional_bus: bool) -> tuple[Device, ...]:
        """Realize the in-scope functions of `devices` on the bus `bus_id`; returns what was realized."""
        out = []
        for device in sorted(devices, key=lambda d: d.dev):
            functions = sorted((f for f in device.functions if f.iommu_scope), key=lambda f: f.fn)
            if not functions:
                continue
            if functions[0].fn != 0:
                raise TopologyError(
                    f"device {device.dev:02x} on {bus_id}: QEMU cannot hold it without function 0"
                )
            multifunction = len(functions) > 1
            realized = tuple(
                self.function(f, device.dev, bus_id, conventional_bus, multifunction) for f in functions
            )
            out.append(Device(device.dev, realized, slot=device.slot))
        return tuple(out)

    def function(
        self, f: Function, dev: int, bus_id: str, conventional_bus: bool, multifunction: bool
    ) -> Function:
        model, acs = _model(f, conventional_bus)
        self.ids += 1
        qid = f"d{self.ids}"
        arg = f"{model.name},id={qid},bus={bus_id},addr={dev:#x}.{f.fn}"
        if f.fn == 0 and multifunction:
            arg += ",multifunction=on"
        if model.kind in (Kind.ROOT_PORT, Kind.DOWNSTREAM):
            self.chassis += 1
            arg += f",chassis={self.chassis},slot=0"
        if model is ROOT_PORT:
            # No I/O window unless a device below needs one: SeaBIOS otherwise gives every port 4 KiB, runs
            # out of the 64 KiB I/O space ("PCI: out of I/O address space") and the guest never starts.
            arg += ",io-reserve=0" + ("" if acs else ",disable-acs=on")
        if model in (DISPLAY, NIC, PCI_NIC, VIRTIO_GPU):
            arg += ",romfile="  # no option ROM: iPXE's would pause every boot for ~2 s
        if model is NVME:
            arg += f",serial=lab{self.ids}"
        self.args += ["-device", arg]
        children = self.devices(f.children, qid, conventional_bus=model.kind is Kind.PCI_BRIDGE)
        endpoint = model.kind in (Kind.ENDPOINT, Kind.CONVENTIONAL)
        kind = Kind.CONVENTIONAL if endpoint and conventional_bus else model.kind
        return replace(
            f,
            vendor=model.vendor,
            device=model.device,
            class_code=model.class_code,
            kind=kind,
            acs=acs,
            subsystem=(0, 0),
            children=children,
        )


def _first_free(used: set[int]) -> int:
    return next(dev for dev in range(1, 0x1F) if dev not in used)


def realize(topology: Topology, iommu: str = "intel") -> Realization:
    """What `topology` becomes in a q35 guest with an emulated `iommu` ("intel" | "amd"); see the module doc.
    Raises TopologyError for what q35 cannot hold (something at 00:00 or 00:1f, a lone function > 0)."""
    if iommu not in IOMMUS:
        raise ValueError(f"unknown IOMMU {iommu!r}; known: {', '.join(IOMMUS)}")
    builder = _Builder()
    rcs = sorted(topology.root_complexes, key=lambda rc: rc.bus)
    if rcs and rcs[0].bus != 0:
        rcs.insert(0, RootComplex(bus=0, numa=None, devices=()))
    bus0 = builder.devices(rcs[0].devices, "pcie.0", conventional_bus=False)
    used = {d.dev for d in bus0}
    if used & {Q35_HOST_BRIDGE.dev, ICH9.dev}:
        raise TopologyError(f"{topology.name}: 00:00 and 00:1f belong to q35's host bridge and ICH9")
    used |= {Q35_HOST_BRIDGE.dev, ICH9.dev}
    expanders: list[Device] = []
    others: list[RootComplex] = []
    for rc in rcs[1:]:
        addr = rc.qemu_addr if rc.qemu_addr is not None else _first_free(used)
        used.add(addr)
        qid = f"pxb{rc.bus:02x}"
        builder.args += ["-device", f"pxb-pcie,id={qid},bus_nr={rc.bus:#x},bus=pcie.0,addr={addr:#x}"]
        expanders.append(Device(addr, (PXB,)))
        others.append(
            replace(rc, devices=builder.devices(rc.devices, qid, conventional_bus=False), qemu_addr=addr)
        )
    bus0_devices = [Q35_HOST_BRIDGE, *bus0, *expanders, ICH9]
    if iommu == "amd":
        # Created last, it takes the first slot left on bus 00.
        builder.args += ["-device", "amd-iommu,intremap=on"]
        bus0_devices.append(Device(_first_free(used), (AMD_IOMMU,)))
    else:
        builder.args = ["-device", "intel-iommu,intremap=on", *builder.args]
    first = RootComplex(bus=0, numa=None, devices=tuple(bus0_devices))
    probe_order = (first, *sorted(others, key=lambda rc: rc.bus, reverse=True))
    realized = Topology(
        f"{topology.name}@q35-{iommu}",
        f"{topology.summary} (as QEMU q35 builds it)",
        probe_order,
        iommu=iommu,
    )
    return Realization(realized, tuple(builder.args))


@dataclass(frozen=True)
class Probed:
    """One `PCI ...` line of the guest's report."""

    address: str
    vendor: int
    device: int
    class_code: int
    group: int | None
    path: str

    @property
    def key(self) -> str:
        """The position without bus numbers, as `lab.topology.Placed.key`: "pci0000:40/01.1/00.0"."""
        parts = self.path.split("/")
        return "/".join([parts[1], *(p.split(":")[-1] for p in parts[2:])])


_PCI_LINE = re.compile(
    r"PCI (?P<address>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) vendor=0x(?P<vendor>[0-9a-f]{4}) "
    r"device=0x(?P<device>[0-9a-f]{4}) class=0x(?P<cls>[0-9a-f]{6}) group=(?P<group>\d+|none) "
    r"path=(?P<path>devices/pci[0-9a-f]{4}:[0-9a-f]{2}(?:/[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])+)"
)


def parse_probe(text: str) -> tuple[Probed, ...]:
    """The functions the guest reported between its `=== BEGIN` and `=== END` markers.
    Raises ValueError if the report is missing or cut short, or a PCI line does not parse."""
    lines = text.replace("\r", "").splitlines()
    begin = next((i for i, line in enumerate(lines) if line.startswith("=== BEGIN")), None)
    end = next((i for i, line in enumerate(lines) if line.startswith("=== END")), None)
    if begin is None or end is None or end < begin:
        raise ValueError("no complete '=== BEGIN' ... '=== END' report in the guest's output")
    probed = []
    for line in lines[begin + 1 : end]:
        if not line.startswith("PCI "):
            continue
        match = _PCI_LINE.fullmatch(line)
        if match is None:
            raise ValueError(f"unparsable PCI line: {line!r}")
        group = match["group"]
        probed.append(
            Probed(
                address=match["address"],
                vendor=int(match["vendor"], 16),
                device=int(match["device"], 16),
                class_code=int(match["cls"], 16),
                group=None if group == "none" else int(group),
                path=match["path"],
            )
        )
    return tuple(probed)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2 or args[0] not in TOPOLOGIES or (len(args) == 2 and args[1] not in IOMMUS):
        print(
            f"usage: python -m lab.kernel.qemu TOPOLOGY [{'|'.join(IOMMUS)}]\ntopologies: "
            f"{' '.join(sorted(TOPOLOGIES))}",
            file=sys.stderr,
        )
        return 2
    for arg in realize(TOPOLOGIES[args[0]], *args[1:]).args:
        print(arg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
