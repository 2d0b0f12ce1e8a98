"""pyinfra's real CLI on an inventory file a test writes: how an operator's inventory is loaded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def doctor_with_inventory(tmp_path: Path, inventory: str) -> subprocess.CompletedProcess[str]:
    """`pyinfra -y <tmp_path>/inventory.py deploy/doctor.py`, run in `tmp_path` with `inventory` as the file's
    text (pvegpu importable from the checkout); its exit status and output, never raising on failure."""
    (tmp_path / "inventory.py").write_text(inventory)
    return subprocess.run(
        [
            str(REPO / ".venv/bin/pyinfra"),
            "-y",
            str(tmp_path / "inventory.py"),
            str(REPO / "deploy/doctor.py"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
