"""What an operator declares about the `lxc` profile's container: host data key `lxc` (LxcSpec).

    ("pve1", {"node": {..., "profile": "lxc"}, "lxc": {"vmid": 200, "ostemplate": "local:vztmpl/..."}})

The container runs on the host's NVIDIA kernel module: its device entries come from the node's GPUs and
Proxmox version (pvegpu/plan/lxc.py), not from this spec.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from pvegpu.models.fields import matching

LXC_KEY = "lxc"

_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?")
_VOLUME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*:vztmpl/[^\s,]+")
_STORAGE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_BRIDGE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,14}")
_PUBLIC_KEY = re.compile(
    r"(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp\d+|sk-\S+@openssh\.com) [A-Za-z0-9+/]+=* ?[^\n]*"
)


class LxcSpec(BaseModel):
    """The LXC container the `lxc` profile serves from: host data key `lxc`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    vmid: StrictInt = Field(ge=100, le=999_999_999, description="Proxmox container id (100-999999999).")
    hostname: Annotated[str, matching(_HOSTNAME, "a host name (letters, digits, hyphens)")] = Field(
        default="llm-ct", description="Container host name."
    )
    ostemplate: Annotated[str, matching(_VOLUME, "a template volume like local:vztmpl/<file>")] = Field(
        description="OS template volume the container is created from (only on create)."
    )
    storage: Annotated[str, matching(_STORAGE, "a Proxmox storage id")] = Field(
        default="local-lvm", description="Storage for the root file system (only on create)."
    )
    rootfs_gib: StrictInt = Field(
        default=64, ge=1, description="Root file system size in GiB (only on create)."
    )
    cores: StrictInt = Field(default=16, ge=1, le=8192, description="CPU cores.")
    memory: StrictInt = Field(default=65536, ge=16, description="RAM in MiB.")
    swap: StrictInt = Field(default=0, ge=0, description="Swap in MiB.")
    bridge: Annotated[str, matching(_BRIDGE, "a Linux bridge name (e.g. vmbr0)")] = Field(
        default="vmbr0", description="Host bridge of `net0` (DHCP; only on create)."
    )
    unprivileged: StrictBool = Field(
        default=True, description="Unprivileged container (Proxmox's default; fixed once created)."
    )
    shm_gib: StrictInt = Field(
        default=16,
        ge=1,
        description=(
            "Size of the container's /dev/shm in GiB: NCCL's shared-memory transport and SGLang's "
            "processes exchange buffers there."
        ),
    )
    video_gid: StrictInt = Field(
        default=44, ge=0, description="Group id the GPU device nodes get inside the container (`video`: 44)."
    )
    onboot: StrictBool = Field(default=True, description="Start the container when the node boots.")
    adopt: StrictBool = Field(
        default=False,
        description=(
            "Take over a container at `vmid` that lacks pvegpu's mark (the `pvegpu` tag and the line "
            "`pvegpu-owner: <pve.owner>` in its description): the run writes the mark, later runs need no "
            "switch. Without it such a container is refused (and never stopped), left as it is."
        ),
    )
    ssh_public_keys: tuple[Annotated[str, matching(_PUBLIC_KEY, "an OpenSSH public key line")], ...] = Field(
        default=(),
        description=(
            "OpenSSH public keys for root in the container (only on create, `ssh-public-keys`): how pyinfra "
            "reaches it as an `lxc_guests` host."
        ),
    )
