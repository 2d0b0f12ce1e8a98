"""What the NVIDIA driver on a host is, as observed: the loaded kernel module, nvidia-smi's GPU list, the CUDA
apt repository's state, and where the driver keeps its capability device nodes. Plain frozen data; the facts
that read them are in pvegpu/facts/nvidia.py and pvegpu/facts/lxc_devices.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Where the driver creates its capability device nodes (MIG, fabric); an LXC container needs them bound in.
CAPS_DIR = "/dev/nvidia-caps"


@dataclass(frozen=True)
class LoadedModule:
    """The NVIDIA kernel module the running kernel has loaded."""

    flavour: Literal["open", "proprietary"]
    version: str


@dataclass(frozen=True)
class NvidiaGpu:
    """One GPU as nvidia-smi lists it."""

    index: int
    name: str
    bus_id: str
    driver_version: str


@dataclass(frozen=True)
class NvidiaSmi:
    """nvidia-smi's GPU list, or (`error`) what it printed instead: no driver loaded, no devices."""

    gpus: tuple[NvidiaGpu, ...]
    error: str | None
