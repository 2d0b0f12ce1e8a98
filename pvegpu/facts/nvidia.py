"""What the NVIDIA driver on a host says: the loaded kernel module (version file) and nvidia-smi's GPU list.

Facts run one command each and accept empty output (no driver yet: the usual case on first provisioning);
parsing is in pure functions. Formats: /proc/driver/nvidia/version's first line is
`NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (...)` for the open
flavour and `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ...` for the proprietary one
(shared/knowledge/sglang-nccl-drivers-lxc-bios.md section 4.1); nvidia-smi's
`--query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader` prints one
`0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 00000000:01:00.0, 580.95.05` line per GPU.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.models.nvidia import LoadedModule, NvidiaGpu, NvidiaSmi

GPU_QUERY = "index,name,pci.bus_id,driver_version"
_MODULE = re.compile(
    r"NVRM version: NVIDIA UNIX (?P<open>Open )?(?:x86_64 )?Kernel Module(?: for \S+)?\s+"
    r"(?P<version>\d+\.\d+(?:\.\d+)?)\s"
)
_GPU = re.compile(
    r"(?P<index>[0-9]{1,9}), (?P<name>.+), "
    r"(?P<bus>[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d), (?P<v>\S+)"
)


def parse_version_file(lines: Sequence[str]) -> LoadedModule | None:
    """The loaded module from the version file's lines; None for no output (no module loaded). Pure.

    Raises FactParseError when the file has text but no `NVRM version:` line pvegpu understands.
    """
    text = "\n".join(lines).strip()
    if not text:
        return None
    match = _MODULE.search(text)
    if match is None:
        raise FactParseError(
            f"NVIDIA version file: no 'NVRM version: ... Kernel Module <version>' in {text!r}"
        )
    return LoadedModule("open" if match["open"] else "proprietary", match["version"])


def parse_nvidia_smi(lines: Sequence[str]) -> NvidiaSmi:
    """nvidia-smi's CSV query output (with its exit status lines appended by the fact's command). Pure.

    Every line is a GPU, or else the whole output is returned as the error (nvidia-smi prints its reason,
    e.g. `NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver`, and exits non-zero).
    """
    text = [line.strip() for line in lines if line.strip()]
    if not text:
        return NvidiaSmi((), "nvidia-smi printed nothing (not installed?)")
    gpus = []
    for line in text:
        match = _GPU.fullmatch(line)
        if match is None:
            return NvidiaSmi((), " ".join(text))
        gpus.append(NvidiaGpu(int(match["index"]), match["name"], match["bus"], match["v"]))
    return NvidiaSmi(tuple(gpus), None)


def version_file_command(version_file: str) -> StringCommand:
    """Print `version_file` (nothing when it is absent: no module loaded); always exit 0."""
    return StringCommand("cat", QuoteString(version_file), "2>/dev/null", "||", "true")


def nvidia_smi_command() -> str:
    """nvidia-smi's GPU list as CSV, or its message when it fails (`parse_nvidia_smi` reads both); exit 0."""
    return f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader 2>&1 || true"


class NvidiaModule(FactBase[LoadedModule | None]):
    """The loaded NVIDIA kernel module from `version_file` (default /proc/driver/nvidia/version); None when
    the file is absent (no module loaded)."""

    @override
    def command(self, version_file: str = "/proc/driver/nvidia/version") -> StringCommand:
        return version_file_command(version_file)

    @override
    def process(self, output: list[str]) -> LoadedModule | None:
        return parse_version_file(output)


def char_devices_command(paths: Sequence[str]) -> str:
    """A command printing each of `paths` that is a character device, one per line (always exit 0)."""
    quoted = " ".join(shlex.quote(path) for path in paths)
    return f'for f in {quoted}; do [ -c "$f" ] && echo "$f"; done; true'


class CharDevices(FactBase[frozenset[str]]):
    """Which of `paths` exist as character devices (the NVIDIA device nodes)."""

    @override
    def command(self, paths: Sequence[str]) -> str:
        return char_devices_command(paths)

    @override
    def process(self, output: list[str]) -> frozenset[str]:
        return frozenset(line.strip() for line in output if line.strip())
