"""The operator's path: every row of the README's command table, exactly as written, on a lab inventory of the
shape pvegpu ships (a Proxmox node in `pve_nodes` and its VM's guest in `vm_guests`), then the three journeys
the project exists for, each twice (the second run changes nothing):

1. `deploy/host.py` on a fresh node;
2. a BIOS change (`python -m lab retopo`): the node boots and its VM starts by itself, the pre-start hook
   repairing the renumbered mappings; `deploy/rebuild_vm.py` and `deploy/site.py` then change nothing;
3. `deploy/site.py` switching to `baremetal` (`PVEGPU_PROFILE=baremetal`, inventory/lab.py's stand-in for
   inventory/baremetal.py) and back to `vm`.

The README's commands name a real node's inventory (`inventory.py`, `inventory/baremetal.py`); on the lab they
are the same commands with `inventory/lab.py` (and `-y`: no terminal answers pyinfra's prompt), nothing else.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import hosts
from tests.lab.gauges import assert_node_gauges, refresh, scraped

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GRAND_TOTAL = re.compile(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.MULTILINE)
ROW = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)
# The README's command table, as an operator reads it (a change there must change this test).
README_COMMANDS = [
    "pyinfra inventory.py deploy/doctor.py",
    "pvegpu topology --sysfs-root DIR [--json]",
    "pyinfra inventory.py deploy/host.py",
    "pyinfra inventory.py deploy/vm.py",
    "pyinfra inventory.py deploy/guest.py",
    "pyinfra inventory.py deploy/site.py",
    "pyinfra inventory.py deploy/rebuild_vm.py",
    "pyinfra inventory/baremetal.py deploy/site.py",
    "pyinfra inventory.py deploy/bench.py",
    "pvegpu mapping --node NAME=SYSFS_DIR [--against PCI_CFG]",
]
NODE_ONLY = ("deploy/host.py", "deploy/vm.py")  # the guest is in the inventory and must be left alone
RENUMBERED_BUSES = ("21", "31", "41", "51", "a1", "b1", "c1", "d1")  # reference-renumbered's GPUs, in order


def readme_commands() -> list[str]:
    section = (REPO / "README.md").read_text().split("## What you can run", 1)[1].split("\n## ", 1)[0]
    return ROW.findall(section)


def run(command: str, **env: str) -> tuple[int, str]:
    """A README command on the lab: `inventory.py` is inventory/lab.py; exit status and output."""
    argv = shlex.split(command.replace("inventory.py", "inventory/lab.py"))
    if argv[0] == "pyinfra":
        argv[1:1] = ["-y"]
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=900,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def totals(command: str, **env: str) -> tuple[tuple[str, str, str, str], str]:
    """(operations, changed, errors, unchanged) of a pyinfra run that must exit 0, and its output."""
    code, output = run(command, **env)
    assert code == 0, output
    found = GRAND_TOTAL.findall(output)
    assert len(found) == 1, output
    return found[0], output


def unchanged(command: str, **env: str) -> str:
    (ops, changed, errors, same), output = totals(command, **env)
    assert (changed, errors, same) == ("-", "-", ops), output
    return output


def lab(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def guest_serves(guest: hosts.LabHost) -> str:
    url = "http://127.0.0.1:30000/v1/models"
    probe = f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read().decode())\""
    done = subprocess.run(hosts.ssh_argv(guest, probe), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["data"][0]["id"])


def task_log(node: hosts.LabHost, kind: str) -> str:
    """The newest task log of `kind` (e.g. `qmstart`) on lab node `node`."""
    logs = sorted(
        (p for p in (node.root / "var/log/pve/tasks").rglob(f"UPID:*:{kind}:*") if p.is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    assert logs, f"no {kind} task on {node.name}"
    return logs[-1].read_text()


def every_row_changes_nothing(name: str, sysfs: str, guest_name: str) -> None:
    """Every row of the README's table on the converged node + guest: exit 0, nothing changed, the guest left
    alone by the node-only entry points (bench measures again on every run, by nature)."""
    for command in README_COMMANDS:
        if command.startswith("pyinfra inventory/baremetal.py"):
            continue  # journey 3
        if command.startswith("pvegpu topology"):
            for flag in ("", " --json"):
                code, output = run(f"pvegpu topology --sysfs-root {sysfs}{flag}")
                assert code == 0, output
                assert output.count("passable") == 8, output
        elif command.startswith("pvegpu mapping"):
            code, output = run(f"pvegpu mapping --node {name}={sysfs}")
            assert code == 0, output
            assert re.findall(r"^gpu\d$", output, re.MULTILINE) == [f"gpu{n}" for n in range(8)], output
            pci_cfg = hosts.get_host(name).root / "etc/pve/mapping/pci.cfg"
            code, output = run(f"pvegpu mapping --node {name}={sysfs} --against {pci_cfg}")
            assert code == 0, output
            assert [f"gpu{n} {name}: unchanged" for n in range(8)] == [
                line for line in output.splitlines() if line.endswith(": unchanged")
            ], output
        elif command.endswith("deploy/bench.py"):
            code, output = run(command)
            assert code == 0, output
            assert (REPO / "bench-results" / guest_name).is_dir()
        else:
            output = unchanged(command)
            entry = command.split()[-1]
            if entry in NODE_ONLY:
                assert f"[{guest_name}] {entry} acts on pve_nodes: not in any, left alone" in output


def test_operator_path_every_readme_command_and_three_journeys_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(tmp_path))  # the doctor's reports, not into the checkout
    assert readme_commands() == README_COMMANDS
    name = f"op{os.getpid() % 10000}"
    guest_name = f"{name}v100"
    lab("up", name, "--topology", "reference", "--pve", "--boot", "grub", "--mode", "nspawn")
    try:
        node = hosts.get_host(name)
        sysfs = str(node.root / node.sysfs_root.lstrip("/"))

        # Journey 1: a fresh node prepared; the second run changes nothing.
        (ops, changed, errors, _), _ = totals("pyinfra inventory.py deploy/host.py")
        assert (ops, changed, errors) == ("3", "3", "-")  # command line, vfio binding, reboot + verify
        unchanged("pyinfra inventory.py deploy/host.py")

        # The main job: the node with its VM, then the guest with driver and SGLang; then nothing changes.
        assert totals("pyinfra inventory.py deploy/site.py")[0][2] == "-"
        assert totals("pyinfra inventory.py deploy/site.py")[0][2] == "-"
        unchanged("pyinfra inventory.py deploy/site.py")
        assert guest_serves(hosts.get_host(guest_name)) == "glm-5"

        every_row_changes_nothing(name, sysfs, guest_name)

        # Journey 2: the BIOS changed (VM stopped, buses and groups renumbered, node booted again): the VM
        # starts by itself (onboot), its pre-start hook repairing the 8 mappings; the rebuild finds nothing
        # to do. A lab guest starts from its image again at every VM start (the lab keeps no guest disk), so
        # site.py serves it again once; then nothing changes.
        lab("retopo", name, "reference-renumbered")
        log = task_log(node, "qmstart")
        repaired = rf"^pvegpu: gpu\d {name}: 0000:\S+ group \d+ -> 0000:\S+ group \d+, repaired$"
        assert len(re.findall(repaired, log, re.MULTILINE)) == 8, log
        # The node's exporter (it starts with the node) shows the hook's repair: each mapping at its new
        # address, healthy; and the node's gauges timer (its service run once now, not waiting 30 s after
        # the boot) finds each valid there now.
        refresh(node)
        assert_node_gauges(scraped(node), name, RENUMBERED_BUSES, hook="repaired", result="repaired")
        unchanged("pyinfra inventory.py deploy/rebuild_vm.py")
        assert totals("pyinfra inventory.py deploy/site.py")[0][2] == "-"
        unchanged("pyinfra inventory.py deploy/site.py")
        assert guest_serves(hosts.get_host(guest_name)) == "glm-5"

        # Journey 3: to bare metal in one run (VM parked, vfio gone, reboot, host driver, SGLang on the
        # node), then nothing changes; back to `vm`: the node, then its guest again, then nothing changes.
        assert totals("pyinfra inventory.py deploy/site.py", PVEGPU_PROFILE="baremetal")[0][2] == "-"
        unchanged("pyinfra inventory.py deploy/site.py", PVEGPU_PROFILE="baremetal")
        assert guest_serves(node) == "glm-5"
        assert totals("pyinfra inventory.py deploy/site.py")[0][2] == "-"
        assert totals("pyinfra inventory.py deploy/site.py")[0][2] == "-"
        unchanged("pyinfra inventory.py deploy/site.py")
        assert guest_serves(hosts.get_host(guest_name)) == "glm-5"
    finally:
        lab("down", name)
        shutil.rmtree(REPO / "bench-results" / guest_name, ignore_errors=True)
