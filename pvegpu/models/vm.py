"""The Q35 VM that gets the GPUs: host data key `vm`.

    ("pve1", {"node": {...}, "vm": {"vmid": 120, "name": "llm", "cores": 32, "memory": 262144}})

Formats are Proxmox's (shared/knowledge/proxmox-hostpci-vm-config.md §3, proxmox-api-behaviour.md §4.2):
vmid `^[1-9][0-9]{2,8}$` (100-999999999), `machine` q35 or a pinned `pc-q35-X.Y[+pveN]`, `memory` ≥ 16 MiB,
`hugepages` `2|1024|any` and only with `numa` (Proxmox: `numa needs to be enabled to use hugepages`).
What pvegpu always sets and does not ask for: `bios: ovmf`, `efidisk0`, `cpu: host`, `balloon: 0`,
`agent: 1`, and `hostpciN: mapping=<prefix>N,pcie=1` per GPU.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from pvegpu.models.fields import matching

VM_KEY = "vm"

_MACHINE = re.compile(r"q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?")
# PVE's `dns-name` format (the VM `name`), and `pve-storage-id`.
_DNS_NAME = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
)
_STORAGE_ID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]")
_BRIDGE = re.compile(r"[a-zA-Z][a-zA-Z0-9_.-]{0,14}")
_MAPPING_PREFIX = re.compile(r"[a-z][a-z0-9_-]*", re.IGNORECASE)


class DiskSpec(BaseModel):
    """The VM's system disk (`scsi0`), allocated on create."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    storage: Annotated[str, matching(_STORAGE_ID, "a Proxmox storage id (e.g. local-lvm)")] = Field(
        default="local-lvm",
        description=(
            "Proxmox storage for the system disk and the EFI vars disk (`pve-storage-id`, e.g. `local-lvm`)."
        ),
    )
    size_gib: StrictInt = Field(
        default=200, ge=1, description="System disk size in GiB, allocated on create."
    )


class NetSpec(BaseModel):
    """The VM's network device (`net0`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    model: Literal["virtio", "e1000", "vmxnet3"] = Field(default="virtio", description="NIC model of `net0`.")
    bridge: Annotated[str, matching(_BRIDGE, "a Linux bridge name (e.g. vmbr0)")] = Field(
        default="vmbr0", description="Host bridge `net0` is attached to (e.g. `vmbr0`)."
    )


class VmSpec(BaseModel):
    """The Q35/OVMF VM the GPUs are passed to: host data key `vm`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    vmid: StrictInt = Field(
        ge=100,
        le=999_999_999,
        description="Proxmox VM id (100-999999999). pvegpu never recreates a VM with disks.",
    )
    name: Annotated[str, matching(_DNS_NAME, "a DNS name (letters, digits, hyphens, dots)")] = Field(
        default="llm", description="VM name (Proxmox `dns-name` format: letters, digits, hyphens, dots)."
    )
    machine: Annotated[str, matching(_MACHINE, "q35 or a pinned pc-q35-X.Y[+pveN] machine")] = Field(
        default="q35",
        description=(
            "Machine type: `q35` (latest) or a pinned version such as `pc-q35-9.2+pve1`; "
            "`pcie=1` passthrough needs q35."
        ),
    )
    cores: StrictInt = Field(default=16, ge=1, le=8192, description="vCPU cores (one socket; `cpu: host`).")
    memory: StrictInt = Field(
        default=65536, ge=16, description="RAM in MiB (all of it is pinned for DMA with passthrough)."
    )
    numa: StrictBool = Field(
        default=True, description="Expose NUMA to the guest (Proxmox `numa: 1`); needed for hugepages."
    )
    hugepages: Literal["2", "1024", "any"] | None = Field(
        default=None,
        description="Back RAM with hugepages of this size in MiB (`2`, `1024` or `any`); None: off.",
    )
    disk: DiskSpec = Field(default_factory=DiskSpec, description="System disk.")
    net: NetSpec = Field(default_factory=NetSpec, description="Network device.")
    onboot: StrictBool = Field(default=True, description="Start the VM when the node boots (`onboot`).")
    mapping_prefix: Annotated[
        str, matching(_MAPPING_PREFIX, "a mapping id prefix (a letter, then a-z 0-9 _ -)")
    ] = Field(
        default="gpu",
        description=(
            "PCI mapping ids are `<prefix>0`, `<prefix>1`, ...; ids outside this scheme are never touched."
        ),
    )
    mmio: Literal["args", "phys-bits"] = Field(
        default="args",
        description=(
            "How the 64-bit MMIO window for the GPUs' BARs is set: `args` (OVMF X-PciMmio64Mb sized from "
            "the BARs; root@pam only) or `phys-bits` (`cpu: host,phys-bits=N`; works with API tokens)."
        ),
    )

    @model_validator(mode="after")
    def _hugepages_need_numa(self) -> VmSpec:
        if self.hugepages is not None and not self.numa:
            raise ValueError("hugepages need numa: true (Proxmox: numa needs to be enabled to use hugepages)")
        return self
