"""Which kernel a host boots next and which kernels have the NVIDIA module built, in ONE command
(`NextBoot`); parsing is pure (`parse_next_boot`).

What it reads, and where proxmox-kernel-helper (`proxmox-boot/functions`, `zz-proxmox-boot`) keeps it: the
kernel pins `/etc/kernel/next-boot-pin` (one boot) and `/etc/kernel/proxmox-boot-pin` (first line each, as its
`get_first_line` reads them), the installed kernel images `/boot/vmlinuz-<release>`, and DKMS's build tree
`/var/lib/dkms/<module>/<version>/<release>/<arch>/module` of the NVIDIA module (`nvidia` in NVIDIA's
packages, `nvidia-current-open` in Debian's).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.sections import marker, split_sections
from pvegpu.models.boot import KernelBoot

NEXT_BOOT_PIN = "/etc/kernel/next-boot-pin"
PINNED_KERNEL = "/etc/kernel/proxmox-boot-pin"
DKMS_TREE = "/var/lib/dkms"
_SECTIONS = ("running", "next_pin", "pin", "images", "dkms", "end")
_RELEASE = re.compile(r"[0-9][A-Za-z0-9.+_~-]{0,127}")
_IMAGE = re.compile(rf"/boot/vmlinuz-({_RELEASE.pattern})")
_BUILT = re.compile(
    rf"{DKMS_TREE}/nvidia[a-z-]*/([0-9][0-9.]{{0,31}})/({_RELEASE.pattern})/[a-z0-9_]+/module"
)


class NextBoot(FactBase[KernelBoot]):
    """`host.get_fact(NextBoot)` (module docstring); `root`: the tree it reads, `/` on a host (a test's
    directory in tests), its paths printed as the host's."""

    @override
    def command(self, root: str = "/") -> str:
        def first_line(path: str) -> str:
            return f"if [ -e {path} ]; then IFS= read -r l < {path} || true; printf '%s\\n' \"$l\"; fi"

        def absolute(pattern: str) -> str:  # every match of `pattern` (relative to root) as /path
            return f"(cd {shlex.quote(root)} && ls -d {pattern} 2>/dev/null | sed 's|^|/|') || true"

        base = root.rstrip("/")

        return "; ".join(
            (
                f"echo {shlex.quote(marker('running'))}",
                "uname -r",
                f"echo {shlex.quote(marker('next_pin'))}",
                first_line(shlex.quote(base + NEXT_BOOT_PIN)),
                f"echo {shlex.quote(marker('pin'))}",
                first_line(shlex.quote(base + PINNED_KERNEL)),
                f"echo {shlex.quote(marker('images'))}",
                absolute("boot/vmlinuz-*"),
                f"echo {shlex.quote(marker('dkms'))}",
                absolute(f"{DKMS_TREE.lstrip('/')}/nvidia*/*/*/*/module"),
                f"echo {shlex.quote(marker('end'))}",
            )
        )

    @override
    def process(self, output: list[str]) -> KernelBoot:
        return parse_next_boot(output)


def parse_next_boot(lines: Sequence[str]) -> KernelBoot:
    """`NextBoot`'s output -> KernelBoot. Pure; FactParseError naming the line for another shape."""
    sections = split_sections(lines, _SECTIONS)
    running = [line for _, line in sections["running"]]
    if len(running) != 1 or not _RELEASE.fullmatch(running[0]):
        raise FactParseError(f"next boot: running kernel: expected one release, got {running!r}")
    pins = [_pin(sections[name]) for name in ("next_pin", "pin")]
    installed = []
    for number, line in sections["images"]:
        match = _IMAGE.fullmatch(line)
        if match is None:
            raise FactParseError(f"next boot: line {number}: {line!r} is not a /boot/vmlinuz-<release> image")
        installed.append(match[1])
    built: dict[str, list[str]] = {}
    for number, line in sections["dkms"]:
        match = _BUILT.fullmatch(line)
        if match is None:
            raise FactParseError(f"next boot: line {number}: {line!r} is not a DKMS module build directory")
        built.setdefault(match[2], []).append(match[1])
    return KernelBoot(
        running=running[0],
        installed=tuple(installed),
        next_pinned=pins[0],
        pinned=pins[1],
        built={release: tuple(versions) for release, versions in built.items()},
    )


def _pin(lines: list[tuple[int, str]]) -> str | None:
    """A pin file's first line: a release, or None for no file or an empty line (no pin)."""
    values = [line.strip() for _, line in lines]
    if not values or not values[0]:
        return None
    if len(values) != 1 or not _RELEASE.fullmatch(values[0]):
        raise FactParseError(f"next boot: kernel pin: expected one release, got {values!r}")
    return values[0]
