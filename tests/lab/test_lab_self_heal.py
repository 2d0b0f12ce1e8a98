"""A node that heals itself: deploy/vm.py installs pvegpu's pre-start hookscript and names it in the VM's
config; after a BIOS change the lab's reboot starts the `onboot` VM through the same path as any start
(pvesh stand-in: hookscript, then Proxmox's mapping check), and the hook decides:

- reference-renumbered, `self_heal: repair`: the VM comes back up by itself, its task log holds the 8
  `repaired` lines; a following deploy/site.py on the node changes nothing, the doctor says the hook is
  installed and current;
- reference (back), `self_heal: check`: the same renumbering is refused with the repair it would make;
  pci.cfg is not written;
- reference-missing-gpu, then reference-other-card (another model in slot 6), `repair`: the VM stays down,
  the task log names the GPU, what changed and the fix command; pci.cfg is byte for byte unchanged, also
  after a second start;
- reference-renumbered, raced: another admin edits gpu0's mapping (a description, through the API) while the
  hook repairs it: the hook's write carries the digest it read, so it is refused, nothing is overwritten, the
  start fails saying so; the next start repairs and starts, the other admin's edit kept.
Runs `python -m lab retopo` as the README shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import boot, hosts
from lab.pve import node as pve_node
from pvegpu.facts.pci_cfg import parse_pci_cfg

pytestmark = pytest.mark.lab

Cli = Callable[..., subprocess.CompletedProcess[str]]
Ssh = Callable[[hosts.LabHost, str], str]
REPO = Path(__file__).resolve().parents[2]
HOST_INVENTORY = "tests/lab/inventories/host_role.py"
VM_DATA = {"vmid": 100, "name": "llm", "cores": 4, "memory": 8192, "disk": {"size_gib": 32}}
FIX = "pyinfra inventory.py deploy/rebuild_vm.py"
HOOK_OPS = (
    "Create and start the Q35 VM | Storage local offers snippets",
    "Create and start the Q35 VM | The node's pre-start hookscript is installed",
)


@pytest.fixture
def name() -> Iterator[str]:
    node = f"sh{os.getpid() % 10000}"  # at most 7 characters: the guest is `<node>v100`
    yield node
    hosts.down(node)


def deploy(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, deploy_file: str, node: hosts.LabHost, **vm: str
) -> dict[str, str]:
    """operation name -> outcome of `pyinfra --json -y` limited to the node, with `vm` data (+ `vm`)."""
    extra = {"pve_host": {"allow_reboot": True}, "vm": {**VM_DATA, **vm}}
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps(extra))
    result = cli("--json", "-y", "--limit", node.name, HOST_INVENTORY, deploy_file, check=False)
    assert result.returncode == 0, result.stderr
    outcome = {}
    for op in json.loads(result.stdout)["results"]["operations"]:
        outcome[op["name"]] = "+".join(kind for kind in ("success", "error", "no_change") if op[kind])
    return outcome


def retopo(node: hosts.LabHost, topology: str) -> None:
    """`python -m lab retopo NODE TOPOLOGY`: the BIOS change, the reboot, the onboot starts."""
    done = subprocess.run(
        [sys.executable, "-m", "lab", "retopo", node.name, topology],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr


def status(ssh: Ssh, node: hosts.LabHost) -> str:
    current = json.loads(
        ssh(node, f"pvesh get /nodes/{node.name}/qemu/100/status/current --output-format json")
    )
    return str(current["status"])


def last_start_log(node: hosts.LabHost) -> list[str]:
    """The lines of the newest qmstart task of VM 100 (the stand-in's task index, then its log file)."""
    tasks = node.root / "var/log/pve/tasks"
    upid = [
        line.split()[0] for line in (tasks / "index").read_text().splitlines() if ":qmstart:100:" in line
    ][-1]
    return next(tasks.glob(f"*/{upid}")).read_text().splitlines()


def hook_gauges(node: hosts.LabHost) -> list[str]:
    """The sample lines of the hook's textfile on `node`, but its time."""
    text = (node.root / "var/lib/prometheus/node-exporter/pvegpu_hook.prom").read_text()
    return [
        line for line in text.splitlines() if line.startswith("pvegpu_hook_") and "_timestamp_" not in line
    ]


def pvegpu_lines(log: list[str]) -> list[str]:
    return [line for line in log if line.startswith("pvegpu: ")]


def test_bios_change_heals_check_refuses_missing_gpu_refuses(
    name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = pve_node.up(name, "reference")
    boot.install(node, "grub")
    prepared = deploy(pyinfra_cli, monkeypatch, "deploy/host.py", node)
    assert "error" not in prepared.values()

    first = deploy(pyinfra_cli, monkeypatch, "deploy/vm.py", node)
    assert [first[op] for op in HOOK_OPS] == ["success", "success"]
    hook = node.root / "var/lib/vz/snippets/pvegpu-hook"
    assert (hook.stat().st_mode & 0o7777, hook.stat().st_uid) == (0o755, 0)
    assert (
        "hookscript: local:snippets/pvegpu-hook" in (node.root / "etc/pve/qemu-server/100.conf").read_text()
    )
    assert status(lab_ssh, node) == "running"
    assert pvegpu_lines(last_start_log(node)) == [f"pvegpu: VM 100 on {name}: 8 GPU mappings valid"]
    again = deploy(pyinfra_cli, monkeypatch, "deploy/vm.py", node)
    assert set(again.values()) == {"no_change"}

    # BIOS change, renumber only: the node's reboot starts the VM, the hook repairs, Proxmox's check passes.
    reference = node.manifest()
    retopo(node, "reference-renumbered")
    renumbered = hosts.get_host(name).manifest()
    assert status(lab_ssh, node) == "running"
    assert pvegpu_lines(last_start_log(node)) == [
        f"pvegpu: gpu{n} {name}: {old['address']} group {old['iommu_group']} -> {new['address']} group "
        f"{new['iommu_group']}, repaired"
        for n, (old, new) in enumerate(zip(reference["gpus"], renumbered["gpus"], strict=True))
    ]
    assert last_start_log(node)[-1] == "TASK OK"
    # The hook's gauges, for the node exporter's textfile collector (no exporter runs without systemd here).
    vm = f'node="{name}",vmid="100"'
    assert hook_gauges(node) == [
        f"pvegpu_hook_start_allowed{{{vm}}} 1",
        f'pvegpu_hook_result{{{vm},result="repaired"}} 1',
        *(
            f'pvegpu_hook_mapping_healthy{{{vm},mapping="gpu{n}",path="{new["address"]}",'
            'status="repaired"} 1'
            for n, new in enumerate(renumbered["gpus"])
        ),
    ]
    settled = deploy(pyinfra_cli, monkeypatch, "deploy/site.py", node)
    # Its first site run writes the node's gauges (deploy/vm.py has no exporter); nothing else changes (this
    # netns node has no systemd: the exporter's unit is left alone).
    changed = {op: outcome for op, outcome in settled.items() if outcome != "no_change"}
    assert changed == {"Export pvegpu's gauges to Prometheus | Write the node's gauges": "success"}, settled
    monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(tmp_path))
    doctor = pyinfra_cli("-y", "--limit", name, HOST_INVENTORY, "deploy/doctor.py", check=False)
    assert f"[{name}] pre-start hook of VM 100 (vm.self_heal repair): installed and current" in doctor.stderr

    # self_heal: check: the renumbering back is refused with the repair it would make; nothing written.
    checking = deploy(pyinfra_cli, monkeypatch, "deploy/vm.py", node, self_heal="check")
    assert checking[HOOK_OPS[1]] == "success"
    cfg = node.root / "etc/pve/mapping/pci.cfg"
    before = cfg.read_bytes()
    retopo(node, "reference")
    assert status(lab_ssh, node) == "stopped"
    lines = pvegpu_lines(last_start_log(node))
    old, new = renumbered["gpus"][0], reference["gpus"][0]
    assert lines[0] == (
        f"pvegpu: gpu0 {name}: {old['address']} group {old['iommu_group']} -> {new['address']} group "
        f"{new['iommu_group']} (renumbered)"
    )
    assert (
        lines[-1]
        == f"pvegpu: VM 100 not started: vm.self_heal is check, so nothing is written; to repair, run: {FIX}"
    )
    assert last_start_log(node)[-1] == (
        "TASK ERROR: hookscript error for 100 on pre-start: command '/var/lib/vz/snippets/pvegpu-hook 100 "
        "pre-start' failed: exit code 1 "
    )
    assert cfg.read_bytes() == before

    # Back to repair: the operator's run repairs and starts; then a card goes missing.
    deploy(pyinfra_cli, monkeypatch, "deploy/vm.py", node)
    assert status(lab_ssh, node) == "running"
    before = cfg.read_bytes()
    retopo(node, "reference-missing-gpu")
    for _ in range(2):
        assert status(lab_ssh, node) == "stopped"
        lines = pvegpu_lines(last_start_log(node))
        assert lines[3].startswith(f"pvegpu: gpu3 {name}: 0000:71:00 group 23: no device there now; ")
        assert lines[-1] == (
            f"pvegpu: VM 100 not started: the GPUs of {name} changed, not only their numbers; check the "
            f"hardware, then run: {FIX}"
        )
        assert cfg.read_bytes() == before
        lab_ssh(node, f"pvesh create /nodes/{name}/qemu/100/status/start")

    other_card_is_refused(node, lab_ssh)


def other_card_is_refused(node: hosts.LabHost, lab_ssh: Ssh) -> None:
    """The missing card comes back (the mappings were never touched: the VM starts); then slot 6 holds
    another model: the VM stays down, the hook names gpu5 and the fix, pci.cfg is not written."""
    cfg = node.root / "etc/pve/mapping/pci.cfg"
    retopo(node, "reference")
    assert status(lab_ssh, node) == "running"
    before = cfg.read_bytes()
    retopo(node, "reference-other-card")
    assert status(lab_ssh, node) == "stopped"
    lines = pvegpu_lines(last_start_log(node))
    gpu5 = [line for line in lines if line.startswith(f"pvegpu: gpu5 {node.name}: ")]
    assert len(gpu5) == 1, lines
    assert "another model" in gpu5[0], lines
    assert lines[-1] == (
        f"pvegpu: VM 100 not started: the GPUs of {node.name} changed, not only their numbers; check the "
        f"hardware, then run: {FIX}"
    )
    assert cfg.read_bytes() == before


# LAB TEST wrapper around the pvesh stand-in: on the first `pvesh set /cluster/mapping/pci/<id>` (the hook's
# first repair, its digest already read), another admin sets that mapping's description through the API first.
RACING_PVESH = """#!/usr/bin/python3
import json, os, subprocess, sys

REAL, RACED = "/usr/bin/pvesh-real", "/var/lib/pvegpu-lab/raced"
args = sys.argv[1:]
racing = args[:1] == ["set"] and args[1:2] and args[1].startswith("/cluster/mapping/pci/")
if racing and not os.path.exists(RACED):
    open(RACED, "w").write(args[1] + "\\n")
    got = json.loads(subprocess.run(
        [REAL, "get", args[1], "--output-format", "json"], capture_output=True, text=True
    ).stdout)
    # Another admin's edit that keeps pvegpu's mark (the hook repairs only what carries it).
    edit = [REAL, "set", args[1], "--description", "edited by another admin " + got.get("description", "")]
    for line in got["map"]:
        edit += ["--map", line]
    subprocess.run(edit, check=True)
os.execv(REAL, [REAL, *args])
"""


def test_concurrent_mapping_edit_is_not_overwritten_next_start_repairs(
    name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = pve_node.up(name, "reference")
    boot.install(node, "grub")
    assert "error" not in deploy(pyinfra_cli, monkeypatch, "deploy/host.py", node).values()
    assert "error" not in deploy(pyinfra_cli, monkeypatch, "deploy/vm.py", node).values()
    assert status(lab_ssh, node) == "running"
    pvesh = node.root / "usr/bin/pvesh"
    pvesh.rename(pvesh.with_name("pvesh-real"))
    pvesh.write_text(RACING_PVESH)
    pvesh.chmod(0o755)
    cfg = node.root / "etc/pve/mapping/pci.cfg"
    written = parse_pci_cfg(cfg.read_text()).mappings
    reference = node.manifest()

    retopo(node, "reference-renumbered")
    renumbered = hosts.get_host(name).manifest()
    assert (node.root / "var/lib/pvegpu-lab/raced").read_text() == "/cluster/mapping/pci/gpu0\n"
    assert status(lab_ssh, node) == "stopped"
    log = last_start_log(node)
    assert pvegpu_lines(log)[-1] == (
        "pvegpu: VM 100 not started: gpu0 not repaired: pvesh set /cluster/mapping/pci/gpu0: update "
        "hardware mapping failed: detected modified configuration - file changed by other user? Try again.; "
        "nothing was overwritten, the next start decides again"
    )
    assert log[-1] == (
        "TASK ERROR: hookscript error for 100 on pre-start: command '/var/lib/vz/snippets/pvegpu-hook 100 "
        "pre-start' failed: exit code 1 "
    )
    raced = parse_pci_cfg(cfg.read_text()).mappings
    assert [(m.id, m.map) for m in raced] == [(m.id, m.map) for m in written]  # no map line written
    mark = f"pvegpu-owner: {name}"  # pvegpu's mark on each mapping it created (the node's name: no cluster)
    assert [m.description for m in written] == [mark] * 8
    assert [m.description for m in raced] == [f"edited by another admin {mark}"] + [mark] * 7

    lab_ssh(node, f"pvesh create /nodes/{name}/qemu/100/status/start")
    assert status(lab_ssh, node) == "running"
    assert pvegpu_lines(last_start_log(node)) == [
        f"pvegpu: gpu{n} {name}: {old['address']} group {old['iommu_group']} -> {new['address']} group "
        f"{new['iommu_group']}, repaired"
        for n, (old, new) in enumerate(zip(reference["gpus"], renumbered["gpus"], strict=True))
    ]
    assert last_start_log(node)[-1] == "TASK OK"
    repaired = parse_pci_cfg(cfg.read_text()).mappings
    assert [m.description for m in repaired] == [f"edited by another admin {mark}"] + [mark] * 7
    assert [m.map for m in repaired] == [
        (m.map[0].replace(moved(old), moved(new)),)
        for m, old, new in zip(written, reference["gpus"], renumbered["gpus"], strict=True)
    ]


def moved(gpu: dict[str, object]) -> str:
    """The part of a map line a renumbering changes: `path=0000:41:00,iommugroup=14`."""
    return f"path={gpu['address']},iommugroup={gpu['iommu_group']}"
