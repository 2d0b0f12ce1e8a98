"""The boot files pvegpu writes or edits on a Proxmox host, read in one command.

Files: the systemd-boot command line (/etc/kernel/cmdline) and whether pvegpu's one-time backup of it exists,
the drop-ins pvegpu owns (GRUB, modules-load.d, modprobe.d), and pvegpu's state file listing the tokens it
added to /etc/kernel/cmdline (so that it removes only its own tokens, never a user's).

And what the consumers of those files generated from them, so a refresh is decided from what the host is:
- GRUB: the `linux` lines of /boot/grub/grub.cfg, and whether it is newer than pvegpu's drop-in
  (grub-mkconfig renames a complete file into place, so its mtime is when it read its inputs).
- systemd-boot: the `options` lines of every `proxmox-*.conf` loader entry on each ESP in
  /etc/kernel/proxmox-boot-uuids. The ESPs are not mounted in normal operation: each is mounted read-only in
  a private mount namespace (as `proxmox-boot-tool status` does) and unmounted with it. Needs root.
- initramfs: the /boot/initrd.img-* images not newer than the vfio modprobe drop-in (or, without one, than
  /etc/modprobe.d itself, whose mtime changes when a file is removed): mkinitramfs copies /etc/modprobe.d and
  update-initramfs renames the new image into place, so an older image lacks the current configuration.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.boot import parse_cmdline
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.sections import marker, split_sections

KERNEL_CMDLINE = "/etc/kernel/cmdline"
KERNEL_CMDLINE_BACKUP = "/etc/kernel/cmdline.pvegpu-orig"
GRUB_DROPIN = "/etc/default/grub.d/pvegpu.cfg"
OWNED_TOKENS = "/etc/pvegpu/cmdline-tokens"
MODULES_LOAD = "/etc/modules-load.d/pvegpu-vfio.conf"
MODPROBE = "/etc/modprobe.d/pvegpu-vfio.conf"
GRUB_CFG = "/boot/grub/grub.cfg"
ESP_LIST = "/etc/kernel/proxmox-boot-uuids"
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
_GENERATED = ("grub_cfg", "esps", "initramfs")
_SECTIONS = (*_FILES, *_GENERATED, "end")
_PRESENT = "present"
_GRUB_LINE = re.compile(r'GRUB_CMDLINE_LINUX="\$\{GRUB_CMDLINE_LINUX\}([^"]*)"')
_CURRENT = "newer-than-dropin"
_ESP = re.compile(r"esp (\S+)")
_UNREADABLE = "unreadable"
# One shell script per generated-state section (module docstring). `find -newer` compares full timestamps.
_GRUB_CFG_SCRIPT = (
    f"if [ -f {GRUB_CFG} ]; then echo {_PRESENT}; "
    f'if [ -n "$(find {GRUB_CFG} -newer {GRUB_DROPIN} 2>/dev/null)" ]; then echo {_CURRENT}; fi; '
    f"grep -E '^[[:space:]]*linux[[:space:]]' {GRUB_CFG} || true; fi"
)
_ESP_MOUNT = (
    'm=$(mktemp -d) && while read -r u _; do [ -n "$u" ] || continue; echo "esp $u"; '
    'if mount -o ro "/dev/disk/by-uuid/$u" "$m" 2>/dev/null; then '
    'cat "$m"/loader/entries/proxmox-*.conf 2>/dev/null | grep -E "^options[[:space:]]"; umount "$m"; '
    f'else echo {_UNREADABLE}; fi; done < {ESP_LIST}; rmdir "$m"'
)
_ESPS_SCRIPT = (
    f"if [ -s {ESP_LIST} ]; then unshare --mount --propagation private sh -c {shlex.quote(_ESP_MOUNT)}; fi"
)
_INITRAMFS_SCRIPT = (
    f"ref={MODPROBE}; [ -e $ref ] || ref=/etc/modprobe.d; "
    "find /boot -maxdepth 1 -name 'initrd.img-*' ! -newer $ref -printf '%f\\n' 2>/dev/null || true"
)


@dataclass(frozen=True)
class EspEntries:
    """One ESP: the tokens of each proxmox loader entry's `options` line; `readable` False: not mounted."""

    uuid: str
    options: tuple[tuple[str, ...], ...]
    readable: bool = True


@dataclass(frozen=True)
class BootFiles:
    """Contents of pvegpu's boot files; None where the file is absent. `owned_tokens`: one token a line.

    Generated state (module docstring): `grub_cfg_lines`: the tokens of each `linux` line of grub.cfg,
    None without grub.cfg; `grub_cfg_current`: grub.cfg is newer than the drop-in; `esps`: the ESPs' loader
    entries; `stale_initramfs`: names of the initramfs images older than the vfio configuration.
    """

    kernel_cmdline: str | None
    backup: str | None
    grub_dropin: str | None
    owned_tokens: tuple[str, ...]
    modules_load: str | None
    modprobe: str | None
    grub_cfg_lines: tuple[tuple[str, ...], ...] | None = None
    grub_cfg_current: bool = False
    esps: tuple[EspEntries, ...] = ()
    stale_initramfs: tuple[str, ...] = ()

    @property
    def backup_present(self) -> bool:
        return self.backup is not None

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
        for name, script in zip(_GENERATED, (_GRUB_CFG_SCRIPT, _ESPS_SCRIPT, _INITRAMFS_SCRIPT), strict=True):
            parts.append(f"echo {shlex.quote(marker(name))}")
            parts.append(script)
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
    grub_cfg = [line for _, line in sections["grub_cfg"]]
    return BootFiles(
        kernel_cmdline=content("kernel_cmdline"),
        backup=content("backup"),
        grub_dropin=content("grub_dropin"),
        owned_tokens=tuple(line.strip() for line in owned.splitlines() if line.strip()),
        modules_load=content("modules_load"),
        modprobe=content("modprobe"),
        grub_cfg_lines=(
            tuple(parse_cmdline([line])[1:] for line in grub_cfg if line.split()[:1] == ["linux"])
            if grub_cfg[:1] == [_PRESENT]
            else None
        ),
        grub_cfg_current=_CURRENT in grub_cfg[1:2],
        esps=_parse_esps([line for _, line in sections["esps"]]),
        stale_initramfs=tuple(line.strip() for _, line in sections["initramfs"] if line.strip()),
    )


def _parse_esps(lines: Sequence[str]) -> tuple[EspEntries, ...]:
    """`esp UUID` lines, each followed by `options ...` lines or `unreadable`."""
    esps: list[EspEntries] = []
    for number, line in enumerate(lines, start=1):
        if match := _ESP.fullmatch(line.strip()):
            esps.append(EspEntries(match[1], ()))
        elif not esps:
            raise FactParseError(f"ESP line {number}: {line!r} before any `esp UUID` line")
        elif line.strip() == _UNREADABLE:
            esps[-1] = EspEntries(esps[-1].uuid, (), readable=False)
        elif line.split()[:1] == ["options"]:
            last = esps[-1]
            esps[-1] = EspEntries(last.uuid, (*last.options, parse_cmdline([line])[1:]), last.readable)
    return tuple(esps)
