"""The pvesh stand-in's `hookscript` (lab/pve/pvesh.py), run as a program: the config key is validated like
PVE::GuestHelpers::check_hookscript, and a VM start runs the `pre-start` hook before Proxmox's mapping check,
dying with exec_hookscript's text when it fails (texts from proxmox/pve-guest-common src/PVE/GuestHelpers.pm,
shared/knowledge/proxmox-hookscripts.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import fakesys
from tests.unit.lab.pve.test_pvesh import GPU0, NODE, VM_ARGS, Pve, Result

HOOK = "local:snippets/hook"


@pytest.fixture
def pve(tmp_path: Path) -> Pve:
    installed = Pve(tmp_path)
    fakesys.write_tree(installed.sysfs, "reference")
    settings = {"node": NODE, "sysfs_root": str(installed.sysfs), "root": str(installed.root)}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    pve_vm = installed("create", "/nodes/pve1/qemu", *VM_ARGS, "--hostpci0", "mapping=gpu0,pcie=1")
    assert pve_vm.err == ""
    return installed


def task_log(pve: Pve, start: Result) -> str:
    """The log of the task whose UPID ends `start`'s output (the task's own lines come first)."""
    upid = start.out.splitlines()[-1].strip('"')
    return next((pve.root / "var/log/pve/tasks").glob(f"*/{upid}")).read_text()


def hook(pve: Pve, text: str, mode: int = 0o755) -> Path:
    path = pve.root / "var/lib/vz/snippets/hook"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("volid", "mode", "message"),
    [
        ("local:iso/hook.iso", None, "'local:iso/hook.iso' is not in the snippets directory"),
        (HOOK, None, f"script '{HOOK}' does not exist"),
        (HOOK, 0o644, f"script '{HOOK}' is not executable"),
    ],
)
def test_error_hookscript_is_checked_like_check_hookscript(
    pve: Pve, volid: str, mode: int | None, message: str
) -> None:
    if mode is not None:
        hook(pve, "#!/bin/sh\n", mode)
    result = pve("set", "/nodes/pve1/qemu/100/config", "--hookscript", volid)
    assert (result.rc, result.out) == (255, "")
    assert result.err.startswith(f"400 Parameter verification failed.\nhookscript: {message}\n")


def test_pre_start_hook_runs_before_the_mapping_check_and_its_failure_stops_the_start(pve: Pve) -> None:
    path = hook(pve, '#!/bin/sh\necho "hook $1 $2"\necho "to stderr" >&2\nexit 3\n')
    assert pve("set", "/nodes/pve1/qemu/100/config", "--hookscript", HOOK) == Result(
        0, f"update VM 100: -hookscript {HOOK}\n", ""
    )
    # gpu0 is not even defined: the hook comes first, and its failure is what the start reports.
    start = pve("create", "/nodes/pve1/qemu/100/status/start")
    message = f"hookscript error for 100 on pre-start: command '{path} 100 pre-start' failed: exit code 3 "
    assert start.err == message + "\n"
    assert task_log(pve, start) == f"hook 100 pre-start\nto stderr\n\nTASK ERROR: {message}\n"


def test_pre_start_hook_that_succeeds_lets_proxmox_check_the_mapping_it_may_have_written(pve: Pve) -> None:
    hook(pve, "#!/bin/sh\necho checked\n")
    pve("set", "/nodes/pve1/qemu/100/config", "--hookscript", HOOK)
    missing = pve("create", "/nodes/pve1/qemu/100/status/start")
    assert missing.err == "PCI device mapping not found for 'gpu0'\n"
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0)
    started = pve("create", "/nodes/pve1/qemu/100/status/start")
    assert (started.err, task_log(pve, started)) == ("", "checked\nTASK OK\n")
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "running"
