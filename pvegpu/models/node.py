"""`node`: one Proxmox node (or bare-metal host) and its GPUs, as the operator declares them:

("pve1", {"node": {"name": "pve1", "gpus": {"ids": ["10de:2bb1"], "count": 8}}})
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from pvegpu.models.fields import AbsolutePath, PciId, shown

NODE_KEY = "node"

# Proxmox `pve-node` format (proxmox-pci-mapping.md §2); 63 is the DNS label limit a hostname obeys.
_NODE_NAME = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?")

_NODE_NAME_MAX = 63


def _check_node_name(value: str) -> str:
    if len(value) > _NODE_NAME_MAX:
        raise ValueError(f"must be at most {_NODE_NAME_MAX} characters (got {len(value)})")
    if not _NODE_NAME.fullmatch(value):
        raise ValueError(
            f"{shown(value)} is not a Proxmox node name "
            "(letters, digits and hyphens, starting and ending with a letter or digit)"
        )
    return value


def _check_unique_ids(ids: tuple[str, ...]) -> tuple[str, ...]:
    if not ids:
        raise ValueError("must list at least one vendor:device id")
    seen: set[str] = set()
    for pci_id in ids:
        if pci_id in seen:
            raise ValueError(f"{pci_id} is listed twice")
        seen.add(pci_id)
    return ids


class GpuSelector(BaseModel):
    """Which PCI functions are this node's GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    ids: Annotated[tuple[PciId, ...], AfterValidator(_check_unique_ids)] = Field(
        description=(
            "GPU models as vendor:device ids (4 hex digits each, e.g. `10de:2bb1`); "
            "case-insensitive, stored lowercase. A display function with one of these ids is a GPU."
        ),
    )
    count: StrictInt | None = Field(
        default=None,
        ge=1,
        description="How many GPUs the node must have (another number found is a problem); None: any number.",
    )


class NodeSpec(BaseModel):
    """One Proxmox node (or bare-metal host) and its GPUs: host data key `node`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    name: Annotated[str, AfterValidator(_check_node_name)] = Field(
        description=(
            "Proxmox node name (as `hostname` prints it): letters, digits and hyphens, "
            "starting and ending with a letter or digit, at most 63 characters."
        ),
    )
    profile: Literal["vm", "lxc", "baremetal"] = Field(
        default="vm",
        description=(
            "Where the inference server runs: `vm` (Q35 VM with the GPUs passed through), "
            "`lxc` (container on the host driver) or `baremetal` (the host itself)."
        ),
    )
    gpus: GpuSelector = Field(description="Which PCI functions are this node's GPUs, and how many to expect.")
    sysfs_root: AbsolutePath = Field(
        default="/sys",
        description="Absolute path where the node's sysfs is read (a captured or lab tree in tests).",
    )
    cmdline_path: AbsolutePath = Field(
        default="/proc/cmdline",
        description="Absolute path of the running kernel command line.",
    )
