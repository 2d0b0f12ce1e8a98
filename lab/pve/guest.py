"""What a lab VM's guest sees: the PCI topology of a Proxmox Q35 VM with passed-through host devices.

`q35_guest(name, node, passed)` describes, in `lab.topology`'s language, the bus a Proxmox VE Q35 guest gets:
QEMU's q35 core (00.0 host bridge, 1f.0 LPC, 1f.2 SATA, 1f.3 SMBus), Proxmox's VGA at 00.1, the four
root ports of /usr/share/qemu-server/pve-q35-4.0.cfg (ich9-pcie-port-1..4 at 1c.0-1c.3), and one more
`pcie-root-port` per hostpci4..15 at the addresses qemu-server's `print_pcie_root_port` gives (10.0-10.7,
11.0-11.3). hostpciN (`pcie=1`) sits alone behind root port N+1, with every function of the host slot it maps,
ids, subsystem, class, revision and BARs copied from the node's functions. Not modelled: the other devices
Proxmox adds (USB, balloon, SCSI, NIC), a vIOMMU (the guest has no IOMMU groups), conventional-PCI placement
(`pcie=0`). The root ports advertise QEMU's x-speed=16,x-width=32 link; no NUMA (numa_node -1); no driver
is bound (no NVIDIA driver in a fresh guest).

`i440fx_guest(name, node, passed)` is the bus of an i440FX (`pc`) guest: QEMU's i440fx core (00.0 host
bridge 8086:1237, 01.0 PIIX3 ISA 8086:7000, 01.1 IDE 8086:7010, 01.3 PIIX4 ACPI 8086:7113), Proxmox's VGA
at 02.0, and each hostpciN as conventional PCI (no `pcie`: Proxmox refuses `pcie=1` without q35) at the
slot qemu-server's PCI.pm gives it: hostpci0/1/2/3 at 10/11/1b/1c on the root bus, hostpci4-15 at
0d-18 behind the `pci.2` pci-bridge (1b36:0001) at 1f.0. `guest_topology` picks the one of a machine type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from lab.topology import Device, Function, Kind, Link, RootComplex, Topology, place

INTEL, QEMU = 0x8086, 0x1B36
ROOT_PORT_LINK = Link("16.0 GT/s PCIe", 32, "16.0 GT/s PCIe", 32)  # pcie-root-port x-speed=16,x-width=32
# hostpciN -> (device, function) of its root port on pcie.0 (pve-q35-4.0.cfg, then print_pcie_root_port).
ROOT_PORTS: dict[int, tuple[int, int]] = {
    **{n: (0x1C, n) for n in range(4)},
    **{n: (0x10, n - 4) for n in range(4, 12)},
    **{n: (0x11, n - 12) for n in range(12, 16)},
}


class GuestError(ValueError):
    """The VM's passthrough cannot be laid out as a Q35 guest (the message says which hostpci and why)."""


@dataclass(frozen=True)
class Passed:
    """hostpciN of a started VM: the host functions it passes (all functions of the slot for a
    function-less path) and whether it is a PCIe device (`pcie=1`)."""

    hostpci: int
    functions: tuple[str, ...]
    pcie: bool = True


def _chipset(fn: int, vendor: int, device: int, class_code: int) -> Function:
    return Function(fn=fn, vendor=vendor, device=device, class_code=class_code, kind=Kind.CONVENTIONAL)


def _root_port(fn: int, child: Device | None) -> Function:
    return Function(
        fn=fn,
        vendor=QEMU,
        device=0x000C,
        class_code=0x060400,
        kind=Kind.ROOT_PORT,
        subsystem=(0x1AF4, 0x1100),
        link=ROOT_PORT_LINK,
        driver="pcieport",
        children=(child,) if child is not None else (),
    )


# hostpciN of an i440FX guest -> (bus, slot): 0 the root bus, 2 behind the pci.2 bridge (qemu-server PCI.pm).
I440FX_SLOTS: dict[int, tuple[int, int]] = {
    0: (0, 0x10),
    1: (0, 0x11),
    2: (0, 0x1B),
    3: (0, 0x1C),
    **{n: (2, 0x0D + n - 4) for n in range(4, 16)},
}
PCI2_SLOT = 0x1F


def guest_topology(name: str, node: Topology, machine: str, passed: Sequence[Passed]) -> Topology:
    """The guest bus of a VM of `machine` (its conf's machine type; `pc` when unset) on `node`."""
    return q35_guest(name, node, passed) if "q35" in machine else i440fx_guest(name, node, passed)


def _copied(node: Topology, item: Passed) -> tuple[Function, ...]:
    """The host functions of hostpciN as the guest sees them (no driver; on a conventional bus QEMU's vfio-pci
    drops the PCIe capability, so no link); GuestError for one not on `node`."""
    host_functions = {p.address: p.function for p in place(node)}
    functions = []
    for address in item.functions:
        if address not in host_functions:
            raise GuestError(f"hostpci{item.hostpci}: {address} is not a function of {node.name}")
        function = replace(host_functions[address], driver=None, children=())
        if not item.pcie:
            function = replace(function, kind=Kind.CONVENTIONAL, link=None)
        functions.append(function)
    return tuple(functions)


def i440fx_guest(name: str, node: Topology, passed: Sequence[Passed]) -> Topology:
    """The i440FX guest of a VM on `node` that passes `passed` (module docstring); raises GuestError for a
    `pcie=1` device (Proxmox: `q35 machine model is not enabled`), an index beyond hostpci15, or a function
    not on the node."""
    buses: dict[int, list[Device]] = {0: [], 2: []}
    for item in passed:
        if item.pcie:
            raise GuestError(f"hostpci{item.hostpci}: q35 machine model is not enabled")
        if item.hostpci not in I440FX_SLOTS:
            raise GuestError(f"hostpci{item.hostpci}: no such hostpci index (0-15)")
        bus, slot = I440FX_SLOTS[item.hostpci]
        buses[bus].append(Device(slot, _copied(node, item)))
    devices = [
        Device(0x00, (_chipset(0, INTEL, 0x1237, 0x060000),)),
        Device(
            0x01,
            (
                _chipset(0, INTEL, 0x7000, 0x060100),
                _chipset(1, INTEL, 0x7010, 0x010180),
                _chipset(3, INTEL, 0x7113, 0x068000),
            ),
        ),
        Device(0x02, (_chipset(0, 0x1234, 0x1111, 0x030000),)),
        *buses[0],
    ]
    if buses[2]:
        bridge = replace(
            _chipset(0, QEMU, 0x0001, 0x060400), children=tuple(sorted(buses[2], key=lambda d: d.dev))
        )
        devices.append(Device(PCI2_SLOT, (bridge,)))
    summary = f"Proxmox i440FX guest {name}: " + (
        ", ".join(f"hostpci{p.hostpci}={p.functions[0].rsplit('.', 1)[0]}" for p in passed)
        or "no passthrough"
    )
    return Topology(
        name=f"i440fx-{name}",
        summary=summary,
        root_complexes=(
            RootComplex(bus=0x00, numa=None, devices=tuple(sorted(devices, key=lambda d: d.dev))),
        ),
        iommu=None,
    )


def q35_guest(name: str, node: Topology, passed: Sequence[Passed]) -> Topology:
    """The Q35 guest of a VM on `node` that passes `passed`; raises GuestError for a function not on the
    node, a `pcie=0` device, an index beyond hostpci15, or a root port QEMU would not show (10.x/11.x
    without function 0)."""
    ports: dict[int, dict[int, Device | None]] = {0x1C: dict.fromkeys(range(4))}
    for item in passed:
        if not item.pcie:
            raise GuestError(f"hostpci{item.hostpci}: only pcie=1 passthrough is modelled by the lab")
        if item.hostpci not in ROOT_PORTS:
            raise GuestError(f"hostpci{item.hostpci}: no such hostpci index (0-15)")
        dev, fn = ROOT_PORTS[item.hostpci]
        ports.setdefault(dev, {})[fn] = Device(0, _copied(node, item))
    for dev, by_fn in ports.items():
        if 0 not in by_fn:
            raise GuestError(
                f"root port {dev:02x}.0 is missing (hostpci{'4' if dev == 0x10 else '12'} unset): "
                f"QEMU's guest would not see the ports behind it"
            )
    devices = [
        Device(0x00, (_chipset(0, INTEL, 0x29C0, 0x060000),)),
        Device(0x01, (_chipset(0, 0x1234, 0x1111, 0x030000),)),
        Device(
            0x1F,
            (
                _chipset(0, INTEL, 0x2918, 0x060100),
                _chipset(2, INTEL, 0x2922, 0x010601),
                _chipset(3, INTEL, 0x2930, 0x0C0500),
            ),
        ),
    ]
    for dev, by_fn in sorted(ports.items()):
        devices.append(Device(dev, tuple(_root_port(fn, child) for fn, child in sorted(by_fn.items()))))
    summary = f"Proxmox Q35 guest {name}: " + (
        ", ".join(f"hostpci{p.hostpci}={p.functions[0].rsplit('.', 1)[0]}" for p in passed)
        or "no passthrough"
    )
    return Topology(
        name=f"q35-{name}",
        summary=summary,
        root_complexes=(RootComplex(bus=0x00, numa=None, devices=tuple(devices)),),
        iommu=None,
    )
