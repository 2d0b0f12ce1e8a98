"""The boot files pvegpu writes or edits on a Proxmox host, read in one command.

Files: the systemd-boot command line (/etc/kernel/cmdline) and whether pvegpu's one-time backup of it exists,
the drop-ins pvegpu owns (GRUB, modules-load.d, modprobe.d), and pvegpu's state file listing the tokens it
added to /etc/kernel/cmdline (so that it removes only its own tokens, never a user's).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.sections import marker, split_sections

KERNEL_CMDLINE = "/etc/kernel/cmdline"
KERNEL_CMDLINE_BACKUP = "/etc/kernel/cmdline.pvegpu-orig"
GRUB_DROPIN = "/etc/default/grub.d/pvegpu.cfg"
OWNED_TOKENS = "/etc/pvegpu/cmdline-tokens"
MODULES_LOAD = "/etc/modules-load.d/pvegpu-vfio.conf"
MODPROBE = "/etc/modprobe.d/pvegpu-vfio.conf"
# Section name per file; a section is empty when the file is absent, and starts with a `present` line if not.
# `awk 1` prints the file with a final newline even where it lacks one, so the next marker starts a line.
_FILES = {
    "kernel_cmdline": KERNEL_CMDLINE,
    "backup": KERNEL_CMDLINE_BACKUP,
    "grub_dropin": GRUB_DROPIN,
    "owned": OWNED_TOKENS,
    "modules_load": MODULES_LOAD,
    "modprobe": MODPROBE,
}
_SECTIONS = (*_FILES, "end")
_PRESENT = "present"
_GRUB_LINE = re.compile(r'GRUB_CMDLINE_LINUX="\$\{GRUB_CMDLINE_LINUX\}([^"]*)"')


@dataclass(frozen=True)
class BootFiles:
    """Contents of pvegpu's boot files; None where the file is absent. `owned_tokens`: one token a line."""

    kernel_cmdline: str | None
    backup_present: bool
    grub_dropin: str | None
    owned_tokens: tuple[str, ...]
    modules_load: str | None
    modprobe: str | None

    @property
    def grub_tokens(self) -> tuple[str, ...]:
        """Tokens of the drop-in's `GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} ..."` line; () without one."""
        for line in (self.grub_dropin or "").splitlines():
            match = _GRUB_LINE.fullmatch(line.strip())
            if match:
                return tuple(match[1].split())
        return ()


class PvegpuBootFiles(FactBase[BootFiles]):
    """Contents of pvegpu's boot files, one command (module docstring)."""

    @override
    def command(self) -> str:
        parts = []
        for name, path in _FILES.items():
            quoted = shlex.quote(path)
            parts.append(f"echo {shlex.quote(marker(name))}")
            parts.append(f"if [ -f {quoted} ]; then echo {_PRESENT}; awk 1 {quoted}; fi")
        parts.append(f"echo {shlex.quote(marker('end'))}")
        return "; ".join(parts)

    @override
    def process(self, output: list[str]) -> BootFiles:
        return parse_boot_files(output)


def parse_boot_files(lines: Sequence[str]) -> BootFiles:
    """Output of `PvegpuBootFiles().command()` -> BootFiles. Pure; FactParseError on missing markers."""
    sections = split_sections(lines, _SECTIONS)

    def content(name: str) -> str | None:
        entries = [line for _, line in sections[name]]
        if not entries or entries[0] != _PRESENT:
            return None
        return "".join(f"{line}\n" for line in entries[1:])

    owned = content("owned") or ""
    return BootFiles(
        kernel_cmdline=content("kernel_cmdline"),
        backup_present=content("backup") is not None,
        grub_dropin=content("grub_dropin"),
        owned_tokens=tuple(line.strip() for line in owned.splitlines() if line.strip()),
        modules_load=content("modules_load"),
        modprobe=content("modprobe"),
    )
