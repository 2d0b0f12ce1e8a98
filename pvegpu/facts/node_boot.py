"""The node's bootloader (`boot.BootLoader`) and pvegpu's boot files (`pvegpu_boot.PvegpuBootFiles`) in ONE
command (`node_boot_command`, the `boot` part of the node's state read, pvegpu/facts/node_read.py): the two
facts' commands one after the other, each output ending with its `#pvegpu:end` marker, parsed by the facts'
own parsers (`parse_node_boot`, pure)."""

from __future__ import annotations

from collections.abc import Sequence

from pvegpu.facts.boot import BootLoader, parse_boot_loader
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.pvegpu_boot import BootFiles, PvegpuBootFiles, parse_boot_files
from pvegpu.facts.sections import marker
from pvegpu.models.boot import BootLoaderInfo

_END = marker("end")


def parse_node_boot(lines: Sequence[str]) -> tuple[BootLoaderInfo, BootFiles]:
    """The bootloader's output up to its end marker, then the boot files'. Pure; FactParseError when the
    first end marker is missing, or from either parser."""
    if _END not in lines:
        raise FactParseError(f"node boot state: no {_END} marker (truncated output)")
    split = list(lines).index(_END) + 1
    return parse_boot_loader(lines[:split]), parse_boot_files(lines[split:])


def node_boot_command() -> str:
    """`BootLoader`'s command, then `PvegpuBootFiles`'s."""
    return f"{BootLoader().command()}; {PvegpuBootFiles().command()}"
