"""`cmdline_tokens`: the kernel command line tokens pvegpu owns, for the bootloader the host really uses.

GRUB: pvegpu owns the whole drop-in /etc/default/grub.d/pvegpu.cfg (appended to GRUB_CMDLINE_LINUX), then
`update-grub`. systemd-boot: pvegpu edits /etc/kernel/cmdline in place (after a one-time backup), keeps the
list of tokens it added in /etc/pvegpu/cmdline-tokens, then `proxmox-boot-tool refresh`.
"""

from __future__ import annotations

from collections.abc import Generator

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts.boot import parse_cmdline
from pvegpu.facts.pvegpu_boot import (
    GRUB_DROPIN,
    KERNEL_CMDLINE,
    KERNEL_CMDLINE_BACKUP,
    OWNED_TOKENS,
    BootFiles,
)
from pvegpu.models.boot import BootLoaderInfo, BootLoaderKind
from pvegpu.operations.files import write_file
from pvegpu.operations.render import render
from pvegpu.plan.cmdline import edit_cmdline

GRUB_TEMPLATE = "pve_host/grub-pvegpu.cfg.j2"


@operation()
def cmdline_tokens(
    tokens: tuple[str, ...], boot: BootLoaderInfo, files: BootFiles
) -> Generator[StringCommand, None, None]:
    """Make the next boot's kernel command line carry exactly pvegpu's `tokens` among those it owns.

    `boot` and `files` are the host's `BootLoader` and `PvegpuBootFiles` facts, read once by the role
    (`proxmox-boot-tool status` mounts every ESP: not twice per run). Refuses (OperationError) an UNKNOWN
    bootloader, and systemd-boot without /etc/kernel/cmdline.
    """
    if boot.kind is BootLoaderKind.GRUB:
        yield from _grub(tokens, files.grub_dropin)
    elif boot.kind is BootLoaderKind.SYSTEMD_BOOT:
        yield from _systemd_boot(tokens, files.kernel_cmdline, files.backup_present, files.owned_tokens)
    else:
        raise OperationError(
            f"{host.name}: bootloader unknown, so no kernel command line is written: "
            + "; ".join(boot.evidence)
        )


def _grub(tokens: tuple[str, ...], current: str | None) -> Generator[StringCommand, None, None]:
    wanted = render(GRUB_TEMPLATE, tokens=tokens)
    if current == wanted:
        host.noop(f"{GRUB_DROPIN} already adds {' '.join(tokens)}")
        return
    yield write_file(GRUB_DROPIN, wanted)
    yield StringCommand("update-grub")


def _systemd_boot(
    tokens: tuple[str, ...], current: str | None, backup_present: bool, owned_before: tuple[str, ...]
) -> Generator[StringCommand, None, None]:
    if current is None:
        raise OperationError(
            f"{host.name}: systemd-boot without {KERNEL_CMDLINE}: "
            f"no command line to add {' '.join(tokens)} to"
        )
    before = parse_cmdline(current.splitlines())
    edit = edit_cmdline(before, owned_before, tokens)
    if edit.tokens == before and edit.owned == owned_before:
        host.noop(f"{KERNEL_CMDLINE} already has {' '.join(tokens)}")
        return
    if not backup_present:
        yield StringCommand("cp", "-p", QuoteString(KERNEL_CMDLINE), QuoteString(KERNEL_CMDLINE_BACKUP))
    yield StringCommand("mkdir", "-p", QuoteString(OWNED_TOKENS.rsplit("/", 1)[0]))
    yield write_file(OWNED_TOKENS, "".join(f"{token}\n" for token in edit.owned))
    if edit.tokens != before:
        yield write_file(KERNEL_CMDLINE, " ".join(edit.tokens) + "\n")
        yield StringCommand("proxmox-boot-tool", "refresh")
