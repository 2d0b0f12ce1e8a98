"""Kernel command line: which tokens pvegpu wants, and how to edit a command line keeping everyone else's.

Pure functions. pvegpu owns only the tokens it added (it remembers them across runs); a token that was on
the command line before pvegpu wanted it stays the user's, and is never removed.

Per profile (see pvegpu/plan/profile.py for the rest of what each profile owns):
- `vm`: `<vendor>_iommu=on iommu=pt`: VFIO needs the IOMMU on (Intel's is off by default; AMD's is on,
  stated so the command line says what it relies on).
- `lxc`, `baremetal`: `iommu=pt` only: the host driver's DMA skips translation, which GPU P2P on the host
  needs (P2P hangs were reported without it); the IOMMU itself is not needed, so `<vendor>_iommu=on` goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.plan.errors import PlanError

# `vm`: the IOMMU on (amd_iommu=on is the default on AMD, stated so the command line says what it relies on)
# and passthrough mode for the host's own devices (iommu=pt: no translation cost, P2P on the host works).
IOMMU_PASSTHROUGH = "iommu=pt"
PROFILES = ("vm", "lxc", "baremetal")


def desired_tokens(profile: str, cpu_vendor: str | None, extra: Sequence[str]) -> tuple[str, ...]:
    """The tokens the profile needs on this CPU, then the operator's extras (duplicates dropped).

    Raises PlanError for an unknown profile, and for `vm` when the CPU vendor is unknown (no
    `<vendor>_iommu=on` to write).
    """
    if profile not in PROFILES:
        raise PlanError(f"node.profile: {profile!r} is not one of {', '.join(PROFILES)}")
    if profile != "vm":
        tokens = [IOMMU_PASSTHROUGH]
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
