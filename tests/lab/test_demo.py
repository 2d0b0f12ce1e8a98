"""README (a): `bash scripts/demo.sh` brings up the lab's Proxmox node and runs the main job on it."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from lab import hosts
from tests.lab.gauges import REFERENCE_BUSES, assert_node_gauges, refresh, scraped, ssh

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
# The reboot stand-in's record of the SSH connections it ended: one, from the lab's end of the veth.
ONE_CONNECTION_CLOSED = re.compile(r" ssh-closed=10\.200\.\d+\.1:\d+$")
GRAND_TOTAL = re.compile(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.MULTILINE)
SERVED = [
    'pvegpu_model_complete{path="/srv/models/GLM-5-NVFP4-MTP",repo="festr2/GLM-5-NVFP4-MTP",'
    'revision="main"} 1',
    'pvegpu_p2p_enabled{mode="off"} 0',
]
CHECKED = re.compile(r"pvegpu_sglang_ready_checked_timestamp_seconds [0-9.]+e\+09")


def served_gauges(guest: hosts.LabHost) -> list[str]:
    """The serving host's gauges, its SGLang check's time checked and left out."""
    lines = scraped(guest)
    assert len([line for line in lines if CHECKED.fullmatch(line)]) == 1, lines
    return [line for line in lines if not CHECKED.fullmatch(line)]


def wait_ready(guest: hosts.LabHost, timeout_s: float = 120.0) -> None:
    """Until the timer's check finds SGLang ready again (the demo's `down` follows; nothing else waits)."""
    deadline = time.monotonic() + timeout_s
    while True:
        refresh(guest)
        if "pvegpu_sglang_ready 1" in served_gauges(guest):
            return
        assert time.monotonic() < deadline, "SGLang did not answer again after its restart"
        time.sleep(2)


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
        # Run 1 changes 21 of the node's 27 operations (host, mappings; the model fetched into the node's
        # store from its stand-in hub: the store, the fetcher, its settings, its unit, the reload, the fetch;
        # the storage's content types, the cloud image downloaded, the user-data snippet, the pre-start hook,
        # the store's directory mapping, the VM created from the image with its virtiofs0, its disk grown,
        # started, its guest's host key recorded; the node's gauges and gauges timer; no host driver to park,
        # no i440FX VM to convert, no pending config change to apply; the node exporter and Python's venv
        # support are in the lab's root); the guest is not in run 1's inventory (it did not exist when run 1
        # connected). Run 2 changes 26 operations on the guest (driver; the node's store mounted read-only:
        # its mount unit, the reload, the mount; SGLang, NCCL's topology file; its gauges and gauges timer)
        # and none on the node (its 21 with the store complete, plus the guest's already-present packages and
        # its node exporter); the doctor changes nothing.
        assert GRAND_TOTAL.findall(output) == [
            ("27", "21", "-", "6"),
            ("49", "26", "-", "23"),
            ("-", "-", "-", "-"),
        ]
        assert f"info: guest {name}v100 of {name} is not in this run's inventory" in output
        verified = r"festr2/GLM-5-NVFP4-MTP@[0-9a-f]{40}: 4 files, 24\.3 MB, verified"
        assert re.search(rf"\[{name}\] model: {verified}", output), output  # run 1's fetch, on the node
        # The doctor (run 3) finds the store still as verified, from the record and the file list alone: on
        # the node, and in the guest through its read-only mount.
        store = "/var/lib/pvegpu/models/GLM-5-NVFP4-MTP"
        assert re.search(rf"\[{name}\]\s+model: {store}: {verified}", output), output
        assert re.search(rf"\[{name}v100\] model: /srv/models/GLM-5-NVFP4-MTP: {verified}", output), output
        gpus = re.findall(r"^(gpu\d)  (\S+)  10de:2bb1 10de:204b .* passable$", output, re.MULTILINE)
        assert [gpu for gpu, _ in gpus] == [f"gpu{index}" for index in range(8)], output
        # The doctor: this run's NCCL read pvegpu's topology file; the journal has no run without it.
        assert re.search(
            rf"\[{name}v100\] NCCL with the topology file \(the current run, logged from [0-9: -]+ UTC\): "
            "NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml\n",
            output,
        ), output
        assert f"[{name}v100] NCCL without the topology file: no run in the journal" in output
        assert f"[{name}v100] NCCL transports of sglang.service (profile vm):" in output
        # Run 1's reboot (the only one) ended the node's SSH connection, as a real reboot does: pyinfra's (the
        # API is the token's HTTPS, a connection per call; root's pvesh session opens at the first root-only
        # write, the VM's create, after the reboot); run 1 still passed, so pyinfra's was re-established.
        reboots = (lab_run_dir / name / "merged/var/log/pvegpu-lab/reboot.log").read_text().splitlines()
        assert len(reboots) == 1, reboots
        assert ONE_CONNECTION_CLOSED.search(reboots[0]), reboots
        # What Prometheus scrapes from each host's node exporter (:9100): the pre-start hook's verdict at the
        # VM's start; the live gauges of each host's timer (run once now rather than waiting its 30 s): the
        # node's mappings as the hook would decide them now, the guest's SGLang; the guest's model and P2P.
        node, guest = hosts.get_host(name), hosts.get_host(f"{name}v100")
        # The guest reads the node's store through virtiofs, read-only (the VM's `virtiofs0: pvegpu-models`).
        assert "virtiofs0: pvegpu-models\n" in ssh(node, "cat /etc/pve/qemu-server/100.conf")
        write = "touch /srv/models/GLM-5-NVFP4-MTP/x 2>&1 || true"
        assert (
            ssh(guest, write)
            == "touch: cannot touch '/srv/models/GLM-5-NVFP4-MTP/x': Read-only file system\n"
        )
        refresh(node)
        assert_node_gauges(scraped(node), name, REFERENCE_BUSES, hook="unchanged", result="valid")
        refresh(guest)
        assert served_gauges(guest) == [*SERVED, "pvegpu_sglang_ready 1"]
        # SGLang stopped: the next check says so; started again, it says ready again.
        ssh(guest, "systemctl stop sglang.service")
        refresh(guest)
        assert served_gauges(guest) == [*SERVED, "pvegpu_sglang_ready 0"]
        ssh(guest, "systemctl start sglang.service")
        wait_ready(guest)
    finally:
        subprocess.run(
            ["bash", "scripts/demo.sh", "down"], cwd=REPO, env=env, check=True, capture_output=True
        )
    assert not Path("/run/netns", hosts.netns_name(name)).exists()
