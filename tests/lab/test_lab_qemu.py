"""A Proxmox lab node's VM start under real QEMU's parsing (lab/pve/qemu_check.py): the GPUDirect clique
addressed `hostpciN.0` on a multifunction slot (the form pvegpu wrote before) fails the start with QEMU's own
message in the task log and `start failed: QEMU exited with code 1` as its status; the same GPU passed
single-function (its display function's path) with `-set device.hostpciN.x-nv-gpudirect-clique=C` starts."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from lab import hosts
from lab.pve import node as pve_node
from tests.lab.test_lab_pve import map_line

pytestmark = pytest.mark.lab

OLD_FORM = "-set device.hostpci0.0.x-nv-gpudirect-clique=0"
NEW_FORM = "-set device.hostpci0.x-nv-gpudirect-clique=0"
MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"q{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def _pvesh(node: hosts.LabHost, args: str) -> subprocess.CompletedProcess[str]:
    argv = hosts.ssh_argv(node, f"pvesh {args}")
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)


def _task_log(node: hosts.LabHost, upid: str) -> str:
    return (node.root / "var/log/pve/tasks" / upid.split(":")[4][-1] / upid).read_text()


def test_clique_of_a_multifunction_slot_fails_the_start_single_function_starts(pve_name: str) -> None:
    node = pve_node.up(pve_name, "reference")
    manifest = node.manifest()
    whole = map_line(manifest, 0, node.name)
    display = whole.replace(
        f"path={manifest['gpus'][0]['address']},", f"path={manifest['gpus'][0]['address']}.0,"
    )
    _pvesh(node, f"create /cluster/mapping/pci --id gpu0 --map {whole}")
    _pvesh(node, f"create /cluster/mapping/pci --id gpu0-display --map {display}")
    vm = f"/nodes/{node.name}/qemu/100"
    _pvesh(
        node,
        f"create /nodes/{node.name}/qemu --vmid 100 --machine q35 --bios ovmf --cpu host --cores 4 "
        f"--memory 8192 --hostpci0 mapping=gpu0,pcie=1 --args '{MMIO} {OLD_FORM}'",
    )

    failed = _pvesh(node, f"create {vm}/status/start --output-format json")
    *output, upid_line = failed.stdout.splitlines()
    upid = json.loads(upid_line)

    assert (output, failed.stderr) == (
        [f'kvm: {OLD_FORM}: there is no device "hostpci0" defined'],
        "start failed: QEMU exited with code 1\n",
    )
    assert _task_log(node, upid) == (
        f'kvm: {OLD_FORM}: there is no device "hostpci0" defined\n'
        "\nTASK ERROR: start failed: QEMU exited with code 1\n"
    )
    status = json.loads(_pvesh(node, f"get {vm}/status/current --output-format json").stdout)
    assert status["status"] == "stopped"

    _pvesh(node, f"set {vm}/config --hostpci0 mapping=gpu0-display,pcie=1 --args '{MMIO} {NEW_FORM}'")
    started = _pvesh(node, f"create {vm}/status/start --output-format json")

    assert started.stderr == ""
    assert _task_log(node, json.loads(started.stdout)).endswith("TASK OK\n")
    status = json.loads(_pvesh(node, f"get {vm}/status/current --output-format json").stdout)
    assert status["status"] == "running"
