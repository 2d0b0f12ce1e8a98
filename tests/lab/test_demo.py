"""README (a): `bash scripts/demo.sh` brings up the lab's Proxmox node and runs the main job on it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from lab import hosts

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
GRAND_TOTAL = re.compile(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.MULTILINE)


def test_demo_runs_the_main_job_and_shows_the_nodes_8_gpus(lab_run_dir: Path) -> None:
    # Its own node name and run directory: a demo the user left running is neither used nor stopped.
    name = f"dm{os.getpid() % 10000}"  # lab host names: at most 11 characters, with `v100`
    env = {**os.environ, "PVEGPU_LAB_RUN": str(lab_run_dir), "PVEGPU_LAB_NODE": name}
    try:
        done = subprocess.run(
            ["bash", "scripts/demo.sh"],
            check=False,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        # Run 1 changes 6 of the node's 7 operations (host, mappings, VM; no host driver to park); run 2
        # changes 21 operations on the new guest (driver, SGLang) and none on the node (its 7, plus the
        # guest's already-present packages); the doctor changes nothing.
        assert GRAND_TOTAL.findall(output) == [
            ("7", "6", "-", "1"),
            ("29", "21", "-", "8"),
            ("-", "-", "-", "-"),
        ]
        gpus = re.findall(r"^(gpu\d)  (\S+)  10de:2bb1 10de:204b .* passable$", output, re.MULTILINE)
        assert [gpu for gpu, _ in gpus] == [f"gpu{index}" for index in range(8)], output
        assert f"[{name}v100] NCCL transports of sglang.service (profile vm):" in output
    finally:
        subprocess.run(
            ["bash", "scripts/demo.sh", "down"], cwd=REPO, env=env, check=True, capture_output=True
        )
    assert not Path("/run/netns", hosts.netns_name(name)).exists()
