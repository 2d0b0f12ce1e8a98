"""Kernel command line: which tokens pvegpu wants, and how to edit a command line keeping everyone else's.

Pure functions. pvegpu owns only the tokens it added (it remembers them across runs); a token that was on
the command line before pvegpu wanted it stays the user's, and is never removed.

Per profile (see pvegpu/plan/profile.py for the rest of what each profile owns):
- `vm`: `<vendor>_iommu=on iommu=pt`: VFIO needs the IOMMU on (Intel's is off by default; AMD's is on,
  stated so the command line says what it relies on).
- `lxc`, `baremetal`: `iommu=pt`: the host driver's DMA skips translation, which GPU P2P on the host
  needs (P2P hangs were reported without it); the IOMMU itself is not needed, so `<vendor>_iommu=on` goes.
  And `pcie_port_pm=off`: no runtime power management of PCIe ports, whose link-down on resume locked up
  these boxes with "Surprise Link Down" (../shared/knowledge/serving-recipe-glm5-sm120.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.plan.errors import PlanError

# `vm`: the IOMMU on (amd_iommu=on is the default on AMD, stated so the command line says what it relies on)
# and passthrough mode for the host's own devices (iommu=pt: no translation cost, P2P on the host works).
IOMMU_PASSTHROUGH = "iommu=pt"
# `lxc`, `baremetal`: PCIe ports kept out of runtime power management (the kernel's pcie_port_pm=off).
PORT_PM_OFF = "pcie_port_pm=off"
PROFILES = ("vm", "lxc", "baremetal")
# The profiles whose GPUs talk P2P on the host that owns them (the host driver; a VM's cannot).
HOST_P2P_PROFILES = ("lxc", "baremetal")


def desired_tokens(profile: str, cpu_vendor: str | None, extra: Sequence[str]) -> tuple[str, ...]:
    """The tokens the profile needs on this CPU, then the operator's extras (duplicates dropped).

    Raises PlanError for an unknown profile, and for `vm` when the CPU vendor is unknown (no
    `<vendor>_iommu=on` to write).
    """
    if profile not in PROFILES:
        raise PlanError(f"node.profile: {profile!r} is not one of {', '.join(PROFILES)}")
    if profile in HOST_P2P_PROFILES:
        tokens = [IOMMU_PASSTHROUGH, PORT_PM_OFF]
        tokens.extend(token for token in extra if token not in tokens)
        return tuple(tokens)
    if cpu_vendor not in ("amd", "intel"):
        raise PlanError(
            f"host: cannot tell the CPU vendor ({cpu_vendor!r} in /proc/cpuinfo), so not which "
            "<vendor>_iommu=on to set"
        )
    tokens = [f"{cpu_vendor}_iommu=on", IOMMU_PASSTHROUGH]
    tokens.extend(token for token in extra if token not in tokens)
    return tuple(tokens)


def retired_tokens(owned_before: Sequence[str], desired: Sequence[str]) -> tuple[str, ...]:
    """Tokens pvegpu owned and no longer wants: a running kernel that has them still needs a reboot."""
    return tuple(token for token in owned_before if token not in desired)


@dataclass(frozen=True)
class CmdlineEdit:
    """A command line after pvegpu's edit. `owned`: the tokens pvegpu added and now owns (to remember)."""

    tokens: tuple[str, ...]
    owned: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]


def edit_cmdline(current: Sequence[str], owned_before: Sequence[str], desired: Sequence[str]) -> CmdlineEdit:
    """Remove the tokens pvegpu owned but no longer wants, append the wanted ones that are missing.

    A wanted token already present and not owned stays the user's (not owned: removing it from the spec
    later leaves it). Order of everything else is kept; pvegpu's own tokens end the line in `desired`
    order, so a profile switch and back gives the same line as a fresh deploy.
    """
    removed = tuple(token for token in owned_before if token not in desired and token in current)
    kept = [token for token in current if token not in owned_before]
    added = tuple(token for token in desired if token not in current)
    owned = tuple(token for token in desired if token in added or token in owned_before)
    appended = tuple(token for token in desired if token not in kept)
    return CmdlineEdit(tokens=(*kept, *appended), owned=owned, added=added, removed=removed)


# What a bootloader adds to the running command line that is no part of /etc/kernel/cmdline.
LOADER_PREFIXES = ("initrd=", "BOOT_IMAGE=")
# x86's COMMAND_LINE_SIZE, the terminating NUL included: a longer line is cut by the kernel.
KERNEL_LIMIT = 2048


def booted_base(running: Sequence[str], pvegpu_tokens: Sequence[str]) -> tuple[str, ...]:
    """The running command line without what the bootloader adds and without pvegpu's tokens: the least a
    systemd-boot /etc/kernel/cmdline must keep."""
    return tuple(
        token for token in running if token not in pvegpu_tokens and not token.startswith(LOADER_PREFIXES)
    )


def cmdline_damage(text: str, base: Sequence[str]) -> str | None:
    """Why a systemd-boot command line file cannot be edited as it is, or None when it can.

    Damaged: empty; an unclosed double quote (a cut write); no `root=` token; or a strict prefix of the
    booted line `base` (a truncated write). `base` from `booted_base`.
    """
    line = " ".join(text.split())
    if not line:
        return "empty"
    if line.count('"') % 2:
        return "cut off (an unclosed quote)"
    if not any(token.startswith("root=") for token in line.split()):
        return "without root="
    booted = " ".join(base)
    if len(line) < len(booted) and booted.startswith(line):
        return "cut off (a prefix of the running command line)"
    return None


def unsafe_cmdline(tokens: Sequence[str], base: Sequence[str], pvegpu_tokens: Sequence[str]) -> str | None:
    """Why a systemd-boot command line must not be written, or None: it lacks `root=`, is (without pvegpu's
    tokens) shorter than the booted line `base`, or reaches the kernel's limit."""
    line = " ".join(tokens)
    if not any(token.startswith("root=") for token in tokens):
        return "it has no root="
    own = " ".join(token for token in tokens if token not in pvegpu_tokens)
    booted = " ".join(base)
    if len(own) < len(booted):
        return f"without pvegpu's tokens it is shorter than the running kernel's ({own!r} < {booted!r})"
    if len(line) >= KERNEL_LIMIT:
        return f"it is {len(line)} bytes, the kernel keeps {KERNEL_LIMIT - 1}"
    return None


def lacking(generated: Sequence[Sequence[str]], wanted: Sequence[str]) -> tuple[str, ...]:
    """The `wanted` tokens missing from any generated boot entry's command line (all, without entries)."""
    if not generated:
        return tuple(wanted)
    return tuple(token for token in wanted if any(token not in line for line in generated))
