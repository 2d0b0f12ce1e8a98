"""Test tiers and their gates.

- unit (unmarked): pure, no privileges, seconds.
- `lab`: the real pyinfra CLI over SSH against lab hosts; needs root and a bootstrapped lab
  (lab/bootstrap.sh).
- `kernel`: boots a real kernel under QEMU; needs qemu-system-x86_64.

A tier whose prerequisites are missing is skipped with the reason, except under PVEGPU_REQUIRE_TIERS=1
(scripts/test.sh, hence CI), where that is an error: CI must never pass by skipping a tier.
`--no-lab` (like `-m "not lab"`) deselects the lab tier.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from lab import root

LAB_TOOLS = (
    "debootstrap",
    "ip",
    "mount",
    "nsenter",
    "ssh",
    "ssh-keygen",
    "systemd-nspawn",
    "unshare",
    "zstd",
)
KERNEL_TOOLS = ("qemu-system-x86_64",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-lab", action="store_true", help="deselect the lab tier (tests marked `lab`)")


def lab_missing() -> str | None:
    """Why the lab tier cannot run here, or None."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, mounts)"
    missing = [tool for tool in LAB_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}: run lab/bootstrap.sh"
    if not Path(sys.executable).with_name("pyinfra").is_file():
        return f"no pyinfra next to {sys.executable}: run lab/bootstrap.sh and use .venv/bin/pytest"
    if not root.base_path().is_dir():
        return f"the lab's root {root.base_path()} is not built: run lab/bootstrap.sh"
    return None


def kernel_missing() -> str | None:
    """Why the kernel tier cannot run here, or None."""
    missing = [tool for tool in KERNEL_TOOLS if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}: run lab/bootstrap.sh" if missing else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--no-lab"):
        deselected = [item for item in items if item.get_closest_marker("lab")]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if not item.get_closest_marker("lab")]
    required = os.environ.get("PVEGPU_REQUIRE_TIERS") == "1"
    for marker, why_not in (("lab", lab_missing), ("kernel", kernel_missing)):
        tier = [item for item in items if item.get_closest_marker(marker)]
        reason = why_not() if tier else None
        if reason is None:
            continue
        if required:
            raise pytest.UsageError(f"the {marker} tier is required (PVEGPU_REQUIRE_TIERS=1) but {reason}")
        for item in tier:
            item.add_marker(pytest.mark.skip(reason=f"{marker} tier: {reason}"))
