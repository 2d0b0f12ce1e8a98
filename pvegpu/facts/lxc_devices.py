"""What the `lxc` profile reads on the node: the NVIDIA device nodes a container needs (`/dev/nvidia-caps/*`
and the character majors of /proc/devices), in one command; and the userspace driver version inside
the container (`pct exec`), for the drift check against the host's kernel module."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.sections import marker, split_sections
from pvegpu.plan.lxc import CAPS_DIR, parse_proc_devices

_SECTIONS = ("caps", "devices", "end")


@dataclass(frozen=True)
class NvidiaNodes:
    """`caps`: the `/dev/nvidia-caps/*` device paths (sorted); `majors`: character device name -> major."""

    caps: tuple[str, ...]
    majors: dict[str, int]


class NvidiaDeviceNodes(FactBase[NvidiaNodes]):
    """The node's nvidia-caps nodes and /proc/devices, one command."""

    @override
    def command(self) -> str:
        return (
            f"echo {shlex.quote(marker('caps'))}; "
            f'for f in {CAPS_DIR}/*; do [ -c "$f" ] && echo "$f"; done; '
            f"echo {shlex.quote(marker('devices'))}; cat /proc/devices; "
            f"echo {shlex.quote(marker('end'))}"
        )

    @override
    def process(self, output: list[str]) -> NvidiaNodes:
        return parse_nvidia_nodes(output)


def parse_nvidia_nodes(lines: Sequence[str]) -> NvidiaNodes:
    """Output of `NvidiaDeviceNodes().command()` -> NvidiaNodes. Pure; FactParseError on missing markers."""
    sections = split_sections(lines, _SECTIONS)
    caps = sorted(line.strip() for _, line in sections["caps"] if line.strip())
    return NvidiaNodes(caps=tuple(caps), majors=parse_proc_devices([line for _, line in sections["devices"]]))


class ContainerDriverVersion(FactBase[str | None]):
    """The NVIDIA userspace driver version inside container `vmid` (its nvidia-smi), None when it has none
    or the container does not run."""

    @override
    def command(self, vmid: int) -> str:
        query = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
        return f"pct exec {int(vmid)} -- {query} 2>/dev/null | head -n 1 || true"

    @override
    def process(self, output: list[str]) -> str | None:
        text = [line.strip() for line in output if line.strip()]
        return text[0] if text else None
