"""`cmdline_tokens`: the kernel command line tokens pvegpu owns, for the bootloader the host really uses.

GRUB: pvegpu owns the whole drop-in /etc/default/grub.d/pvegpu.cfg (appended to GRUB_CMDLINE_LINUX, checked
with `sh -n` as update-grub sources it), then `update-grub`. systemd-boot: pvegpu edits /etc/kernel/cmdline
in place (after a one-time backup), keeps the list of tokens it added in /etc/pvegpu/cmdline-tokens, then
`proxmox-boot-tool refresh`.

The refresh follows what the host is, not what this run wrote: it also runs when the generated boot
configuration (grub.cfg's `linux` lines, the ESPs' loader entries) lacks the tokens or is older than the
drop-in, so a run cut between the write and the refresh is finished by the next. Files are written
atomically (pvegpu.operations.files). A systemd-boot line without `root=`, shorter than the running one
(pvegpu's tokens aside) or over the kernel's limit is never written; an empty or cut-off /etc/kernel/cmdline
is restored from the running command line (else from the backup), with a warning.
"""

from __future__ import annotations

from collections.abc import Generator

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts.boot import parse_cmdline
from pvegpu.facts.pvegpu_boot import (
    GRUB_CFG,
    GRUB_DROPIN,
    KERNEL_CMDLINE,
    KERNEL_CMDLINE_BACKUP,
    OWNED_TOKENS,
    BootFiles,
)
from pvegpu.models.boot import BootLoaderInfo, BootLoaderKind
from pvegpu.operations.files import regenerate, write_file
from pvegpu.operations.render import render
from pvegpu.plan.cmdline import booted_base, cmdline_damage, edit_cmdline, lacking, unsafe_cmdline
from pvegpu.run.node_state import running_cmdline

GRUB_TEMPLATE = "pve_host/grub-pvegpu.cfg.j2"
# As update-grub reads the drop-in: sourced by /bin/sh.
GRUB_SYNTAX_CHECK = "sh -n"
UPDATE_GRUB = regenerate("update-grub", GRUB_CFG)
REFRESH_ESPS = regenerate("proxmox-boot-tool refresh", "the ESPs' loader entries")


@operation()
def cmdline_tokens(
    tokens: tuple[str, ...], boot: BootLoaderInfo, files: BootFiles, cmdline_path: str = "/proc/cmdline"
) -> Generator[StringCommand, None, None]:
    """Make the next boot's kernel command line carry exactly pvegpu's `tokens` among those it owns.

    `boot` and `files` are the node's bootloader and boot files, read once by the role
    (`proxmox-boot-tool status` mounts every ESP: not twice per run); the running command line (systemd-boot
    only, read at `cmdline_path`) comes from the same read while nothing changed (pvegpu/run/node_state.py).
    Refuses (OperationError) an UNKNOWN bootloader, systemd-boot without /etc/kernel/cmdline, and an unsafe
    systemd-boot line (module docstring).
    """
    if boot.kind is BootLoaderKind.GRUB:
        yield from _grub(tokens, files)
    elif boot.kind is BootLoaderKind.SYSTEMD_BOOT:
        running = running_cmdline(host, cmdline_path)
        yield from _systemd_boot(tokens, files, running)
    else:
        raise OperationError(
            f"{host.name}: bootloader unknown, so no kernel command line is written: "
            + "; ".join(boot.evidence)
        )


def _grub(tokens: tuple[str, ...], files: BootFiles) -> Generator[StringCommand, None, None]:
    wanted = render(GRUB_TEMPLATE, tokens=tokens)
    if files.grub_dropin == wanted:
        stale = _grub_cfg_stale(tokens, files)
        if stale is None:
            host.noop(f"{GRUB_DROPIN} already adds {' '.join(tokens)}, and {GRUB_CFG} has them")
            return
        logger.info(f"{host.print_prefix}{GRUB_CFG} {stale}: running update-grub")
    else:
        yield write_file(GRUB_DROPIN, wanted, check=GRUB_SYNTAX_CHECK)
    yield UPDATE_GRUB


def _grub_cfg_stale(tokens: tuple[str, ...], files: BootFiles) -> str | None:
    if files.grub_cfg_lines is None:
        return "is missing"
    missing = lacking(files.grub_cfg_lines, tokens)
    if missing:
        return f"lacks {' '.join(missing)}"
    if not files.grub_cfg_current:
        return f"is older than {GRUB_DROPIN}"
    return None


def _systemd_boot(
    tokens: tuple[str, ...], files: BootFiles, running: tuple[str, ...]
) -> Generator[StringCommand, None, None]:
    current = files.kernel_cmdline
    if current is None:
        raise OperationError(
            f"{host.name}: systemd-boot without {KERNEL_CMDLINE}: "
            f"no command line to add {' '.join(tokens)} to"
        )
    pvegpu_tokens = (*files.owned_tokens, *tokens)
    base = booted_base(running, pvegpu_tokens)
    start = _restored(current, files.backup, base)
    before = parse_cmdline(start.splitlines())
    edit = edit_cmdline(before, files.owned_tokens, tokens)
    line = " ".join(edit.tokens) + "\n"
    rewrite = line != " ".join(parse_cmdline(current.splitlines())) + "\n" or start != current
    if rewrite:
        refused = unsafe_cmdline(edit.tokens, base, pvegpu_tokens)
        if refused is not None:
            raise OperationError(
                f"{host.name}: not writing {KERNEL_CMDLINE} {line.strip()!r}: {refused}; "
                f"fix {KERNEL_CMDLINE} by hand (the running line is in /proc/cmdline)"
            )
    stale = _esps_stale(edit.tokens, files)
    if not rewrite and edit.owned == files.owned_tokens and stale is None:
        host.noop(f"{KERNEL_CMDLINE} already has {' '.join(tokens)}, and every ESP boots with it")
        return
    if files.backup is None:
        yield write_file(KERNEL_CMDLINE_BACKUP, start)
    if edit.owned != files.owned_tokens:
        yield StringCommand("mkdir", "-p", QuoteString(OWNED_TOKENS.rsplit("/", 1)[0]))
        yield write_file(OWNED_TOKENS, "".join(f"{token}\n" for token in edit.owned))
    if rewrite:
        yield write_file(KERNEL_CMDLINE, line)
    elif stale is not None:
        logger.info(f"{host.print_prefix}{stale}: running proxmox-boot-tool refresh")
    if rewrite or stale is not None:
        yield REFRESH_ESPS


def _restored(current: str, backup: str | None, base: tuple[str, ...]) -> str:
    """`current`, or when it is damaged the running line (else the backup) it is restored from, warned."""
    damage = cmdline_damage(current, base)
    if damage is None:
        return current
    running = " ".join(base) + "\n"
    for source, text in (("the running kernel's command line", running), (KERNEL_CMDLINE_BACKUP, backup)):
        if text is not None and cmdline_damage(text, base) is None:
            restoring = f"{KERNEL_CMDLINE} is {damage}: restoring it from {source}"
            logger.warning(f"{host.print_prefix}{restoring}: {text.strip()!r}")
            return text
    raise OperationError(
        f"{host.name}: {KERNEL_CMDLINE} is {damage}, and neither the running command line nor "
        f"{KERNEL_CMDLINE_BACKUP} can restore it (no root=): write it by hand"
    )


def _esps_stale(line: tuple[str, ...], files: BootFiles) -> str | None:
    """Why the ESPs do not boot exactly `line`, or None."""
    for esp in files.esps:
        if not esp.readable:
            return f"ESP {esp.uuid} could not be read"
        if not esp.options:
            return f"ESP {esp.uuid} has no proxmox boot entry"
        if any(options != line for options in esp.options):
            return f"ESP {esp.uuid} boots with another command line than {KERNEL_CMDLINE}"
    return None
