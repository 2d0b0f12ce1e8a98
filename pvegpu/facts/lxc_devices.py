"""What the `lxc` profile reads on the node: the NVIDIA device nodes a container needs (`/dev/nvidia-caps/*`
and the character majors of /proc/devices), in one command; and the userspace driver version inside
the container (`pct exec`, its NVML library's file name), for the drift check against the host's kernel
module."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.sections import marker, split_sections
from pvegpu.models.nvidia import CAPS_DIR

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


_MAJOR = re.compile(r"[0-9]{1,9}")  # ASCII digits: str.isdigit() takes "²", which int() refuses


def parse_proc_devices(lines: Sequence[str]) -> dict[str, int]:
    """Character device name -> major from /proc/devices (`Character devices:` section; `195 nvidia`)."""
    majors: dict[str, int] = {}
    section = None
    for line in lines:
        text = line.strip()
        if text.endswith("devices:"):
            section = text
            continue
        words = text.split()
        if section == "Character devices:" and len(words) == 2 and _MAJOR.fullmatch(words[0]):
            majors.setdefault(words[1], int(words[0]))
    return majors


# Where Debian/Ubuntu (multiarch) and the `.run` installer put NVML; its file name carries the version.
NVML_GLOBS = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*", "/usr/lib64/libnvidia-ml.so.*")
_NVML_VERSION = re.compile(r"libnvidia-ml\.so\.(\d{3}\.\d+(?:\.\d+)?)")


class ContainerDriverVersion(FactBase[str | None]):
    """The NVIDIA userspace driver version inside container `vmid`, from its NVML library's file name
    (`libnvidia-ml.so.580.95.05`): nvidia-smi itself refuses to run when the versions differ. None when the
    container has no userspace driver or does not run."""

    @override
    def command(self, vmid: int) -> str:
        listing = f'for f in {" ".join(NVML_GLOBS)}; do [ -f "$f" ] && echo "$f"; done'
        return f"pct exec {int(vmid)} -- sh -c {shlex.quote(listing)} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_nvml_version(output)


def parse_nvml_version(lines: Sequence[str]) -> str | None:
    """The driver version of the first `libnvidia-ml.so.<version>` path in `lines` (not `.so.1`)."""
    for line in lines:
        match = _NVML_VERSION.search(line.strip().rsplit("/", 1)[-1])
        if match is not None:
            return match[1]
    return None
