"""How a host boots: running kernel command line, bootloader (detected), Proxmox release. One command each.

Bootloader detection follows what proxmox-boot-tool itself does (proxmox-kernel-helper: `functions`,
`proxmox-boot-tool`, `zz-proxmox-boot`):

- /etc/kernel/proxmox-boot-uuids lists the ESPs proxmox-boot-tool keeps in sync. With at least one entry,
  `proxmox-boot-tool refresh` (run by kernel hooks and by `update-grub`) writes the boot entries, and per ESP
  it configures GRUB when the ESP holds `EFI/proxmox/grubx64.efi` or the host booted in legacy BIOS mode,
  otherwise systemd-boot (whose entries take their options from /etc/kernel/cmdline). The ESPs are not
  mounted in normal operation, so the fact asks `proxmox-boot-tool status` (it mounts each ESP in a private
  mount namespace, lists it, unmounts; needs root), which reports the boot mode and per ESP
  `uefi (versions: ...)` (a loader.conf: systemd-boot) and/or `grub (versions: ...)` (a grub directory).
- Without ESP entries the host boots the classic way; GRUB when /etc/default/grub and update-grub exist.
- Anything else, or ESPs that disagree or hold both loaders on a UEFI boot, is UNKNOWN: never guessed.
  /etc/kernel/cmdline alone is no evidence (zz-proxmox-boot reads it only for systemd-boot ESPs).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.sections import marker, split_sections
from pvegpu.models.boot import BootLoaderInfo, BootLoaderKind, PveRelease

ESP_LIST = "/etc/kernel/proxmox-boot-uuids"
KERNEL_CMDLINE = "/etc/kernel/cmdline"
DEFAULT_GRUB = "/etc/default/grub"
_FILES = (ESP_LIST, KERNEL_CMDLINE, DEFAULT_GRUB)
_COMMANDS = ("proxmox-boot-tool", "update-grub")
_BOOT_SECTIONS = ("files", "commands", "esps", "status", "end")

# A kernel parameter: unquoted characters and "double quoted" runs (which may hold spaces); an unclosed
# quote runs to the end, as the kernel's own next_arg() reads it.
_CMDLINE_TOKEN = re.compile(r'(?:[^\s"]|"[^"]*"?)+')
_BOOT_MODE = re.compile(r"System currently booted with (uefi|legacy bios)")
_ESP_STATUS = re.compile(r"(\S+) is configured with: ?(.*)")
_ESP_LOADER = re.compile(r"\b(uefi|grub) \(versions:")
_PVEVERSION = re.compile(r"pve-manager/([0-9]+(?:\.[^/\s]*)?)/([0-9a-f]+) \(running kernel: (\S+)\)")


class KernelCmdline(FactBase[tuple[str, ...]]):
    """The running kernel's parameters, verbatim tokens of `cmdline_path` (default /proc/cmdline).

    Tokens after `--` (arguments for init) are included as they are. A missing file fails the fact.
    """

    @override
    def command(self, cmdline_path: str = "/proc/cmdline") -> str:
        return f"cat -- {shlex.quote(cmdline_path)}"

    @override
    @staticmethod
    def default() -> tuple[str, ...]:
        return ()

    @override
    def process(self, output: list[str]) -> tuple[str, ...]:
        return parse_cmdline(output)


class BootLoader(FactBase[BootLoaderInfo]):
    """Which bootloader owns the kernel command line, with the evidence seen (module docstring)."""

    @override
    def command(self) -> str:
        files = " ".join(_FILES)
        commands = " ".join(_COMMANDS)
        return "; ".join(
            (
                f"echo {shlex.quote(marker('files'))}",
                f'for f in {files}; do if [ -e "$f" ]; then echo "$f"; fi; done',
                f"echo {shlex.quote(marker('commands'))}",
                f'for c in {commands}; do if command -v "$c" >/dev/null 2>&1; then echo "$c"; fi; done',
                f"echo {shlex.quote(marker('esps'))}",
                f"grep -s . {ESP_LIST}",
                f"echo {shlex.quote(marker('status'))}",
                f"if [ -s {ESP_LIST} ] && command -v proxmox-boot-tool >/dev/null 2>&1; "
                "then proxmox-boot-tool status 2>&1; fi",
                f"echo {shlex.quote(marker('end'))}",
            )
        )

    @override
    @staticmethod
    def default() -> BootLoaderInfo:
        return BootLoaderInfo(BootLoaderKind.UNKNOWN, (), False, ("fact not collected",))

    @override
    def process(self, output: list[str]) -> BootLoaderInfo:
        return parse_boot_loader(output)


class PveVersion(FactBase[PveRelease | None]):
    """The Proxmox VE release (`pveversion`); None on a host without `pveversion` (not Proxmox)."""

    @override
    def command(self) -> str:
        return "if command -v pveversion >/dev/null 2>&1; then pveversion; fi"

    @override
    def process(self, output: list[str]) -> PveRelease | None:
        return parse_pveversion(output)


def parse_cmdline(lines: Sequence[str]) -> tuple[str, ...]:
    """Kernel command line -> tokens, split on whitespace outside double quotes; quotes are kept. Pure."""
    return tuple(_CMDLINE_TOKEN.findall(" ".join(lines)))


def parse_pveversion(lines: Sequence[str]) -> PveRelease | None:
    """`pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.12-1-pve)` -> PveRelease; no output -> None.

    Raises FactParseError for any other output.
    """
    text = [line for line in lines if line.strip()]
    if not text:
        return None
    match = _PVEVERSION.fullmatch(text[0].strip()) if len(text) == 1 else None
    if match is None:
        raise FactParseError(
            f"pveversion: expected 'pve-manager/<version>/<build> (running kernel: <kernel>)', got {text!r}"
        )
    return PveRelease(manager_version=match[1], build=match[2], running_kernel=match[3])


def parse_boot_loader(lines: Sequence[str]) -> BootLoaderInfo:
    """Output of `BootLoader().command()` -> BootLoaderInfo. Pure; the rules are in the module docstring.

    Raises FactParseError for missing markers or an unexpected line in the files/commands sections.
    """
    sections = split_sections(lines, _BOOT_SECTIONS)
    files = _known(sections["files"], _FILES)
    commands = _known(sections["commands"], _COMMANDS)
    esps = tuple(line.strip() for _, line in sections["esps"] if line.strip())
    evidence: list[str] = []
    if esps:
        evidence.append(f"{ESP_LIST} lists {len(esps)} ESP(s): {', '.join(esps)}")
        kind = _from_proxmox_boot_tool([line for _, line in sections["status"]], commands, evidence)
    else:
        evidence.append(f"{ESP_LIST} {'lists no ESP' if ESP_LIST in files else 'absent'}")
        grub_file = DEFAULT_GRUB in files
        update_grub = "update-grub" in commands
        evidence.append(f"{DEFAULT_GRUB} {'present' if grub_file else 'absent'}")
        evidence.append(f"update-grub {'found' if update_grub else 'not found'}")
        kind = BootLoaderKind.GRUB if grub_file and update_grub else BootLoaderKind.UNKNOWN
    evidence.append(f"{KERNEL_CMDLINE} {'present' if KERNEL_CMDLINE in files else 'absent'}")
    return BootLoaderInfo(
        kind=kind, esp_uuids=esps, kernel_cmdline_file=KERNEL_CMDLINE in files, evidence=tuple(evidence)
    )


def _known(entries: list[tuple[int, str]], allowed: Sequence[str]) -> set[str]:
    for number, line in entries:
        if line not in allowed:
            raise FactParseError(f"line {number}: expected one of {', '.join(allowed)}, got {line!r}")
    return {line for _, line in entries}


def _from_proxmox_boot_tool(status: list[str], commands: set[str], evidence: list[str]) -> BootLoaderKind:
    if "proxmox-boot-tool" not in commands:
        evidence.append("proxmox-boot-tool not found on PATH")
        return BootLoaderKind.UNKNOWN
    evidence.extend(f"proxmox-boot-tool status: {line}" for line in status)
    mode = next((m[1] for line in status if (m := _BOOT_MODE.fullmatch(line.strip()))), None)
    verdicts = {
        m[1]: _esp_loader(set(_ESP_LOADER.findall(m[2])), mode)
        for line in status
        if (m := _ESP_STATUS.fullmatch(line.strip()))
    }
    if mode is None or not verdicts:
        evidence.append("proxmox-boot-tool status reported no boot mode or no configured ESP")
        return BootLoaderKind.UNKNOWN
    kinds = set(verdicts.values())
    if len(kinds) != 1:
        evidence.append("the ESPs do not agree on one bootloader")
        return BootLoaderKind.UNKNOWN
    kind = kinds.pop()
    if kind is BootLoaderKind.UNKNOWN:
        evidence.append(f"an ESP's loaders do not decide the bootloader on a {mode} boot")
    return kind


def _esp_loader(loaders: set[str], mode: str | None) -> BootLoaderKind:
    """zz-proxmox-boot per ESP: GRUB on a legacy boot or a GRUB-only ESP, systemd-boot on a UEFI boot."""
    if loaders == {"grub"} or (mode == "legacy bios" and "grub" in loaders):
        return BootLoaderKind.GRUB
    if loaders == {"uefi"} and mode == "uefi":
        return BootLoaderKind.SYSTEMD_BOOT
    return BootLoaderKind.UNKNOWN
