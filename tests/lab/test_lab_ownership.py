"""Ownership on a Proxmox lab node, through the real pyinfra CLI: pvegpu touches only what carries its mark
(the tag `pvegpu` and `pvegpu-owner: <id>` in the description; pvegpu/plan/ownership.py).

- Another admin's VM at `vm.vmid` (an installed VM, no mark): deploy/vm.py is refused in one line naming it
  and `vm.adopt`, before anything is written (no mapping made), with `--dry` as with `-y`; its config is byte
  for byte what it was. (Adopting it, converging it and the run after it changing nothing:
  tests/lab/test_lab_convert.py, whose inventory says `vm.adopt: true`.)
- Parking (tests/lab/deploys/park_guests.py, the profile switch's first step): pvegpu's running VM is shut
  down cleanly (a `qmshutdown` task, no `qmstop`) and gets `onboot: 0`; a foreign container at `lxc.vmid`
  (no mark, `onboot: 1`) is left alone, its config byte-identical; the second run changes nothing.
The node's id in the mark is its name (inventory/lab.py sets no `pve.owner` or `pve.cluster`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest

from lab import hosts
from lab.pve import node as pve_node
from lab.pve import seed
from tests.lab.test_lab_vm import VM_INVENTORY, mappings

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
Cli = Callable[..., subprocess.CompletedProcess[str]]
PARK = "tests/lab/deploys/park_guests.py"
PARK_VM = "Stop the Q35 VM for a host-driver profile | Stop the VM and keep it from starting at boot"
PARK_CT = "Stop the GPU container for another profile | Stop the container and keep it from starting at boot"


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"o{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def conf(node: hosts.LabHost, kind: str, vmid: int) -> str:
    return (node.root / f"etc/pve/{kind}/{vmid}.conf").read_text()


def test_error_another_admins_vm_is_refused_and_left_byte_identical(pve_name: str, pyinfra_cli: Cli) -> None:
    node = pve_node.up(pve_name, "reference")
    seed.seed_vm(node.name, 100, esp=True)  # an operator's own installed VM at inventory/lab.py's vm.vmid
    before = conf(node, "qemu-server", 100)

    for flags in (["--dry"], ["-y"]):
        refused = pyinfra_cli(*flags, "--limit", node.name, VM_INVENTORY, "deploy/vm.py", check=False)

        assert refused.returncode != 0
        assert (
            f"VM 100 on {node.name} is not pvegpu's (no pvegpu mark): left as it is; to let pvegpu manage "
            "it, set vm.adopt: true (adopting writes pvegpu's mark)"
        ) in refused.stderr
        assert conf(node, "qemu-server", 100) == before
        assert mappings(node) == {}  # refused before anything was written


def park(cli: Cli, node: hosts.LabHost, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Operation name -> outcome of tests/lab/deploys/park_guests.py on `node` (profile lxc: it has `vm`
    and `lxc` data)."""
    monkeypatch.setenv("PVEGPU_PROFILE", "lxc")
    result = cli("--json", "-y", "--limit", node.name, "inventory/lab.py", PARK, check=False)
    assert result.returncode == 0, result.stderr
    outcome = {}
    for op in json.loads(result.stdout)["results"]["operations"]:
        outcome[op["name"]] = "+".join(kind for kind in ("success", "error", "no_change") if op[kind])
    return outcome


def test_parking_shuts_pvegpus_vm_down_and_leaves_a_foreign_container_alone(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = pve_node.up(pve_name, "reference")
    api = f"/nodes/{node.name}"
    lab_ssh(
        node,
        f"pvesh create {api}/qemu --vmid 100 --name llm --memory 512 --onboot 1 --tags pvegpu "
        f"--description 'pvegpu-owner: {node.name}'",
    )
    lab_ssh(node, f"pvesh create {api}/qemu/100/status/start")
    lab_ssh(
        node,
        f"pvesh create {api}/lxc --vmid 200 --ostemplate "
        "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst --rootfs local-lvm:4 --onboot 1 "
        "--hostname alice-ct",
    )
    container = conf(node, "lxc", 200)

    first = park(pyinfra_cli, node, monkeypatch)

    assert (first[PARK_VM], first[PARK_CT]) == ("success", "no_change")
    status = json.loads(lab_ssh(node, f"pvesh get {api}/qemu/100/status/current --output-format json"))
    assert status["status"] == "stopped"
    assert "onboot: 0\n" in conf(node, "qemu-server", 100)
    tasks = json.loads(lab_ssh(node, f"pvesh get {api}/tasks --vmid 100 --output-format json"))
    assert [task["type"] for task in tasks if task["type"] in ("qmshutdown", "qmstop")] == ["qmshutdown"]
    assert conf(node, "lxc", 200) == container  # not pvegpu's: not parked, not marked

    again = park(pyinfra_cli, node, monkeypatch)

    assert (again[PARK_VM], again[PARK_CT]) == ("no_change", "no_change")
    assert conf(node, "lxc", 200) == container
