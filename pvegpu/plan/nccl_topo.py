"""The NCCL topology file of a VM guest (`NCCL_TOPO_FILE`): the host's NUMA layout and PCIe links. Pure.

Inside a Q35 VM every passed-through GPU sits on a virtual root port with no NUMA node and QEMU's fake x32
link, so NCCL's own detection puts them all under one `<cpu numaid="-1">` (shared/fixtures/real/12). NCCL's
maintainers advise giving it "a PCI tree functionally equivalent to the host" (NVIDIA/nccl #1843, #1674);
`plan_nccl_topo` writes that tree in the format NCCL's parser (src/graph/xml.cc) and its reader (topo.cc)
take, the format NCCL's own `NCCL_TOPO_DUMP_FILE` has:

    <system version="1">
      <cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">
        <pci busid="0000:01:00.0" class="0x030000" vendor="0x10de" device="0x2bb1" subsystem_vendor="0x10de"
         subsystem_device="0x204b" link_speed="32.0 GT/s PCIe" link_width="16"/>   (one line in the file)
      </cpu>
    </system>

- Each guest GPU is found by its guest bus id and mapped back to the VM's `hostpciN` by the root port it
  sits behind (`Q35_ROOT_PORTS`: qemu-server puts hostpci0-3 on pve-q35-4.0.cfg's ich9-pcie-port-1..4 at
  1c.0-1c.3 and adds a pcie-root-port for hostpci4-15 at 10.0-10.7, 11.0-11.3), and `hostpciN` to the node's
  card gpuN (pvegpu's VM passes mapping gpuN as hostpciN, `pvegpu.plan.hostpci.desired_hostpci`). A guest GPU
  whose ids differ from its card's, a card the guest does not show, or a GPU on another port is refused.
- One `<cpu>` per host NUMA node holding the VM's GPUs, each GPU (sorted by bus id, as NCCL keeps them) under
  the `<cpu>` of its card's node. `numaid` is the GUEST's NUMA node: NCCL reads it as a node of the machine
  it runs on (`/sys/devices/system/node/node<numaid>/cpumap` gives the ranks' CPU affinity). pvegpu's
  `vm.numa_layout: host` makes guest node i of the i-th host node holding the VM's GPUs
  (pvegpu/plan/numa.py), so numaid is that index (host nodes 0 and 1 of the reference box stay 0 and 1).
  A guest without NUMA has only node 0: NCCL finds no cpumap for numaid 1.., logs "Affinity for GPU <n>
  is empty, ignoring" and leaves those ranks unpinned; the separate numaids still tell it which GPUs are a
  socket apart (its inter-CPU path and bandwidth model). Cards whose host node is unknown go under numaid
  -1, as NCCL's own detection puts them.
- `link_speed` / `link_width`: the card's link, limited by its upstream port: min of the two `max_link_*`
  values (the rule NCCL applies to sysfs itself), the current ones where a max is unknown. Not the current
  values first: a GPU held idle by vfio-pci trains its link down (2.5 GT/s), which would make the file
  change, and SGLang restart, with the GPUs' load. Speed in NCCL's words (`32.0 GT/s PCIe`); a link not
  known at all is left out, and NCCL asks the GPU through NVML as it does without the file.
- Written only where pvegpu knows better than the guest: NCCL fills every attribute a file leaves out, from
  the guest (`LEFT_TO_NCCL`): the CPU's familyid/modelid from cpuid (the host's: pvegpu's VMs run
  `cpu: host`) and its affinity from the numaid's cpumap; the `<gpu>` element (dev: the NVML index, sm:
  the compute capability, rank, gdr: the communicator's), which NCCL would take as written and so must not
  be guessed; NICs, which NCCL adds itself. `arch`/`vendor` come from the node's CPU vendor (absent: not
  x86, left to NCCL too).
- Not modelled: PCIe switches between a card and its root port (each GPU hangs off its `<cpu>` directly),
  NVLink (none between passed-through PCIe cards in a VM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from pvegpu.models.hardware import HostHardware, PciFunction
from pvegpu.plan.errors import PlanError
from pvegpu.plan.topology import DISPLAY_CLASSES, GpuCard, Topology

TOPO_FILE = "/etc/pvegpu/nccl-topo.xml"
NCCL_TOPO_XML_VERSION = "1"  # xml.h NCCL_TOPO_XML_VERSION; NCCL refuses any other
NO_NUMA = -1

# The guest root port (on pcie.0, 0000:00) behind which hostpciN sits: qemu-server's q35 layout
# (shared/knowledge/proxmox-hostpci-vm-config.md, "What the machine type decides").
Q35_ROOT_PORTS: dict[str, int] = {
    **{f"0000:00:1c.{n}": n for n in range(4)},
    **{f"0000:00:10.{n - 4}": n for n in range(4, 12)},
    **{f"0000:00:11.{n - 12}": n for n in range(12, 16)},
}

# Attributes NCCL's readers need that this file leaves for NCCL to fill from the guest, and why.
LEFT_TO_NCCL = {
    ("cpu", "familyid"): "cpuid of the guest, the host's under cpu: host",
    ("cpu", "modelid"): "cpuid of the guest, the host's under cpu: host",
    ("cpu", "affinity"): "the guest node's cpumap for numaid",
    ("gpu", "dev"): "the GPU's NVML index in the guest",
    ("gpu", "sm"): "the GPU's compute capability (NVML)",
    ("gpu", "rank"): "the communicator's rank",
    ("gpu", "gdr"): "the communicator's GPUDirect RDMA support",
}
_CPU_VENDORS = {"amd": "AuthenticAMD", "intel": "GenuineIntel"}  # pvegpu's vendor word -> cpuid's
_T = TypeVar("_T")


@dataclass(frozen=True)
class GuestGpu:
    """One GPU of the guest: its guest bus id, its `hostpciN`, the node's card, where the file puts it."""

    guest_address: str
    hostpci: int
    card: GpuCard
    numaid: int
    link_speed: str | None
    link_width: int | None


@dataclass(frozen=True)
class NcclTopo:
    """The guest's GPUs (sorted by guest bus id) and the file's text."""

    gpus: tuple[GuestGpu, ...]
    xml: str


def plan_nccl_topo(
    host_topology: Topology, host_hardware: HostHardware, guest_hardware: HostHardware, cpu_vendor: str | None
) -> NcclTopo:
    """The topology file of the guest whose VM passes `host_topology`'s cards gpuN as hostpciN.

    `host_hardware` is the node's PCI fact (for the cards' upstream ports), `guest_hardware` the guest's,
    `cpu_vendor` the node's (`amd`/`intel`/None, `pvegpu.models.boot.CpuKernel.vendor`). Raises PlanError
    (`vm: ...`) when the guest's GPUs cannot be mapped to the cards one to one.
    """
    cards = host_topology.gpus
    found = _guest_gpus(guest_hardware, cards)
    missing = [f"hostpci{n} ({card.name}, {card.address})" for n, card in enumerate(cards) if n not in found]
    if missing:
        raise PlanError(f"vm: the guest shows no GPU for {', '.join(missing)}: is the VM running its config?")
    nodes = sorted({card.numa_node for card in cards if card.numa_node is not None})
    gpus = []
    for hostpci, guest in sorted(found.items(), key=lambda item: item[1].address):
        card = cards[hostpci]
        speed, width = _link(card, host_hardware)
        numaid = NO_NUMA if card.numa_node is None else nodes.index(card.numa_node)
        gpus.append(GuestGpu(guest.address, hostpci, card, numaid, speed, width))
    return NcclTopo(gpus=tuple(gpus), xml=_xml(gpus, guest_hardware, cpu_vendor))


def link_speed_words(gts: float) -> str:
    """NCCL's name of a PCIe speed (its kvDictPciGen): 32.0 -> `32.0 GT/s PCIe`."""
    return f"{gts:.1f} GT/s PCIe"


def _guest_gpus(guest: HostHardware, cards: Sequence[GpuCard]) -> dict[int, PciFunction]:
    """hostpci index -> the guest's display function behind that index's root port."""
    ids = {card.id for card in cards}
    found: dict[int, PciFunction] = {}
    for function in guest.functions:
        if function.class_base not in DISPLAY_CLASSES or function.id not in ids:
            continue
        port = function.parents[0] if function.parents else None
        hostpci = Q35_ROOT_PORTS.get(port or "")
        if hostpci is None:
            raise PlanError(
                f"vm: guest GPU {function.address} sits behind {port or 'no root port'}, not a q35 root port "
                "of a hostpci device (pcie=1)"
            )
        if hostpci >= len(cards):
            raise PlanError(
                f"vm: guest GPU {function.address} is hostpci{hostpci}, but the node passes "
                f"{len(cards)} GPUs (hostpci0-{len(cards) - 1})"
            )
        card = cards[hostpci]
        if (function.id, function.subsystem_id) != (card.id, card.subsystem_id):
            raise PlanError(
                f"vm: guest GPU {function.address} (hostpci{hostpci}) is {function.id} "
                f"(subsystem {function.subsystem_id}), but {card.name} ({card.address}) is {card.id} "
                f"(subsystem {card.subsystem_id})"
            )
        found[hostpci] = function
    return found


def _link(card: GpuCard, hardware: HostHardware) -> tuple[str | None, int | None]:
    """(NCCL's speed words, lanes) of the card's link limited by its upstream port (module docstring)."""
    gpu = hardware.by_address.get(card.gpu_function)
    port = hardware.by_address.get(gpu.parents[-1]) if gpu is not None and gpu.parents else None
    links = [link for link in (card.link, port.link if port is not None else None) if link is not None]
    speeds = [s for s in (_first(link.max_speed_gts, link.current_speed_gts) for link in links) if s]
    widths = [w for w in (_first(link.max_width, link.current_width) for link in links) if w]
    return (link_speed_words(min(speeds)) if speeds else None), (min(widths) if widths else None)


def _first(*values: _T | None) -> _T | None:
    return next((value for value in values if value is not None), None)


def _xml(gpus: Sequence[GuestGpu], guest: HostHardware, cpu_vendor: str | None) -> str:
    """The file's text, laid out as NCCL's dumper writes it (2 spaces per level, `/>` for a leaf)."""
    lines = [f'<system version="{NCCL_TOPO_XML_VERSION}">']
    for numaid in sorted({gpu.numaid for gpu in gpus}):
        cpu = [("numaid", str(numaid))]
        if cpu_vendor in _CPU_VENDORS:
            cpu += [("arch", "x86_64"), ("vendor", _CPU_VENDORS[cpu_vendor])]
        lines.append(f"  <cpu {_attrs(cpu)}>")
        for gpu in (g for g in gpus if g.numaid == numaid):
            function = guest.by_address[gpu.guest_address]
            pci = [
                ("busid", gpu.guest_address),
                ("class", f"0x{function.class_code:06x}"),
                ("vendor", f"0x{function.vendor}"),
                ("device", f"0x{function.device}"),
                ("subsystem_vendor", f"0x{function.subsystem_vendor}"),
                ("subsystem_device", f"0x{function.subsystem_device}"),
            ]
            if gpu.link_speed is not None:
                pci.append(("link_speed", gpu.link_speed))
            if gpu.link_width is not None:
                pci.append(("link_width", str(gpu.link_width)))
            lines.append(f"    <pci {_attrs(pci)}/>")
        lines.append("  </cpu>")
    lines.append("</system>")
    return "\n".join(lines) + "\n"


def _attrs(pairs: Sequence[tuple[str, str]]) -> str:
    return " ".join(f'{key}="{value}"' for key, value in pairs)
