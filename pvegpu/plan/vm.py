"""The Q35 VM's config from its spec, the change to make to an existing VM, and readiness checks. Pure.

`vm_config(spec, mapping_ids, window)` gives the keys pvegpu converges field by field; `create_keys(spec)`
the keys given only when the VM is created (disks are allocated then; the NIC gets its MAC then):

    name, machine (q35 or pinned), bios ovmf, ostype l26, cpu host, sockets 1, cores, memory, numa,
    hugepages (when set), balloon 0, agent 1, onboot, scsihw, hostpciN (mapping=<prefix>N,pcie=1),
    args (-fw_cfg name=opt/ovmf/X-PciMmio64Mb,... for vm.mmio = args) or cpu host,phys-bits=N

`diff_vm` compares with the config the API returns (ints and strings as Proxmox types them) and never
touches a disk that exists: a missing disk is added, an existing one is left as it is, nothing is recreated.
`args` is shared: pvegpu owns only its `X-PciMmio64Mb` part and keeps every other part verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.hardware import HostHardware
from pvegpu.models.vm import VmSpec
from pvegpu.plan.hostpci import HOSTPCI_KEY, desired_hostpci, diff_hostpci
from pvegpu.plan.mmio import MmioWindow
from pvegpu.plan.topology import Topology

VFIO = "vfio-pci"
NVIDIA = "10de"
DISPLAY = 0x03
_MMIO_ARG = re.compile(r"\s*-fw_cfg\s+name=opt/ovmf/X-PciMmio64Mb,string=\S+")


def vm_config(spec: VmSpec, mapping_ids: Sequence[str], window: MmioWindow | None) -> dict[str, str]:
    """The keys pvegpu converges (see the module docstring), values as Proxmox stores them."""
    cpu = "host"
    if window is not None and spec.mmio == "phys-bits":
        cpu = f"host,phys-bits={window.phys_bits}"
    config = {
        "name": spec.name,
        "machine": spec.machine,
        "bios": "ovmf",
        "ostype": "l26",
        "cpu": cpu,
        "sockets": "1",
        "cores": str(spec.cores),
        "memory": str(spec.memory),
        "numa": "1" if spec.numa else "0",
        "balloon": "0",
        "agent": "1",
        "onboot": "1" if spec.onboot else "0",
        "scsihw": "virtio-scsi-single",
        **desired_hostpci(mapping_ids),
    }
    if spec.hugepages is not None:
        config["hugepages"] = spec.hugepages
    if window is not None and spec.mmio == "args":
        config["args"] = window.args
    return config


def create_keys(spec: VmSpec) -> dict[str, str]:
    """Keys given only on create: the EFI vars disk (4m, no pre-enrolled keys), the system disk, the NIC."""
    storage = spec.disk.storage
    return {
        "efidisk0": f"{storage}:1,efitype=4m,pre-enrolled-keys=0",
        "scsi0": f"{storage}:{spec.disk.size_gib},iothread=1",
        "net0": f"{spec.net.model},bridge={spec.net.bridge}",
    }


@dataclass(frozen=True)
class VmChange:
    """Keys to set (value as Proxmox stores it) and keys to delete; both empty: no change."""

    set: dict[str, str]
    delete: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete)


def merge_args(current: str | None, mmio_args: str) -> str:
    """`current` args with pvegpu's X-PciMmio64Mb part replaced by `mmio_args`; other parts kept."""
    rest = _MMIO_ARG.sub("", current or "").strip()
    return f"{rest} {mmio_args}" if rest else mmio_args


def diff_vm(
    desired: Mapping[str, str], create: Mapping[str, str], current: Mapping[str, object], prefix: str
) -> VmChange:
    """What to PUT so `current` has `desired` (from vm_config); raises HostPciError for a taken slot.

    - plain keys: compared as text (`16` == 16); `hugepages` is deleted when the spec has none;
    - `args`: only pvegpu's part is compared and replaced;
    - `net0`: model and bridge compared, the MAC kept; `efidisk0`/`scsi0`: added when missing, else left.
    """
    hostpci = {key: value for key, value in desired.items() if HOSTPCI_KEY.fullmatch(key)}
    to_set: dict[str, str] = {}
    for key, value in desired.items():
        if key in hostpci:
            continue
        now = current.get(key)
        wanted = merge_args(None if now is None else str(now), value) if key == "args" else value
        if now is None or str(now) != wanted:
            to_set[key] = wanted
    delete = ["hugepages"] if "hugepages" in current and "hugepages" not in desired else []
    for key in ("efidisk0", "scsi0"):
        if key not in current:
            to_set[key] = create[key]
    net = _net(current.get("net0"))
    model, _, bridge = create["net0"].partition(",bridge=")
    if net is None:
        to_set["net0"] = create["net0"]
    elif (net[0], net[2]) != (model, bridge):
        to_set["net0"] = f"{model}={net[1]},bridge={bridge}" if net[1] else create["net0"]
    change = diff_hostpci(hostpci, current, prefix)
    to_set.update(change.set)
    return VmChange(to_set, (*delete, *change.delete))


def _net(value: object) -> tuple[str, str, str] | None:
    """(model, MAC or '', bridge) of a netN value; None when absent."""
    if value is None:
        return None
    head, _, rest = str(value).partition(",")
    model, _, mac = head.partition("=")
    options = dict(part.partition("=")[::2] for part in rest.split(",") if part)
    return model, mac, options.get("bridge", "")


def unbound_functions(hw: HostHardware, topology: Topology) -> tuple[str, ...]:
    """`address (driver)` of every function of the selected cards not bound to vfio-pci right now."""
    found = []
    for card in topology.gpus:
        for address in card.functions:
            driver = hw.by_address[address].driver
            if driver != VFIO:
                found.append(f"{address} ({driver or 'no driver'})")
    return tuple(found)


def nvidia_gpus(hw: HostHardware) -> tuple[str, ...]:
    """Addresses of the NVIDIA display functions `hw` shows (what a guest counts as its GPUs)."""
    return tuple(f.address for f in hw.functions if f.vendor == NVIDIA and f.class_code >> 16 == DISPLAY)
