"""A create of VM 100 by another identity than pvegpu's, dead on the node, is never destroyed.

The node's API token (`pvegpu@pve!deploy`, lab/pve/api_setup.py: another identity than root@pam, whom
pvegpu acts as over the `ssh` backend) creates VM 100 through the HTTPS API; its worker's leftover is
then what a killed create leaves (the stub `lock: create`), and pvegpu's create record on this machine says
pvegpu sent a create of VM 100 at the same second whose POST never answered (the race that could make the
proof misfire). Two runs of deploy/vm.py each report the leftover as not provably pvegpu's (the task ran as
the token), and leave its config byte-identical and its task the guest's newest. Then, with a record of that
very task (proving it pvegpu's) and the VM an HA resource, the run refuses in one line before anything is
unlocked: the config stays byte-identical.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import boot, hosts
from lab.pve import api_setup
from lab.pve import node as pve_node
from pvegpu.local.create_records import ledger_beside
from pvegpu.plan.create_proof import CreateRecord, start_time
from pvegpu.pve.https import connect_https
from tests.lab.test_lab_vm import prepare_host

pytestmark = pytest.mark.lab

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(autouse=True)
def pvesh_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """pvegpu reaches the API through root's pvesh (`ssh`): it acts as root@pam, not as the token."""
    monkeypatch.setenv("PVEGPU_LAB_PVE_BACKEND", "ssh")


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"d{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def test_error_dead_create_of_another_identity_is_never_destroyed(
    pve_name: str, pyinfra_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = pve_node.up(pve_name, "reference")
    boot.install(node, "grub")
    prepare_host(pyinfra_cli, monkeypatch, node)
    api = api_setup.record(node)
    assert api is not None
    token = connect_https(
        node.address, api["token_id"], Path(api["token_file"]).read_text().strip(),
        fingerprint=api["fingerprint"], timeout=30,
    )  # fmt: skip
    upid = token.create_vm(pve_name, 100, {"name": "theirs", "memory": 512})
    token.wait_task(upid, 60)
    config = node.root / "etc/pve/qemu-server/100.conf"
    config.write_text("lock: create\n")  # what its worker leaves when killed before its final write
    sent = start_time(upid)
    assert sent is not None
    ledger = ledger_beside(hosts.known_hosts_path(), "root@pam", cluster=None, owner=None, node=pve_name)
    assert ledger is not None
    ledger.write(pve_name, "qemu", 100, CreateRecord(upid=None, sent=sent, nonce="5eed" * 8))
    try:
        for _ in range(2):
            result = pyinfra_cli("-y", "--limit", pve_name, "inventory/lab.py", "deploy/vm.py", check=False)

            assert result.returncode != 0, result.stderr
            assert (
                f"[{pve_name}] VM 100: the dead create {upid} is not provably pvegpu's: the task ran as "
                f"{api['token_id']}, pvegpu acts as root@pam\n"
            ) in result.stderr, result.stderr
            assert (
                f"[{pve_name}] VM 100 is locked (create); its last task {upid} no longer runs"
                in result.stderr
            )
            assert "Traceback" not in result.stderr
            assert config.read_text() == "lock: create\n"
            assert token.guest_tasks(pve_name, 100)[0].upid == upid

        # Proven pvegpu's by a record of its very task, but an HA resource: Proxmox refuses its destroy
        # without `purge`, so it is refused before anything is unlocked.
        ledger.write(pve_name, "qemu", 100, CreateRecord(upid=upid, sent=sent, nonce="5eed" * 8))
        (node.root / "etc/pve/ha").mkdir(parents=True, exist_ok=True)
        (node.root / "etc/pve/ha/resources.cfg").write_text("vm: 100\n\tstate started\n")
        held = pyinfra_cli("-y", "--limit", pve_name, "inventory/lab.py", "deploy/vm.py", check=False)

        assert held.returncode != 0, held.stderr
        assert (
            f"VM 100 on {pve_name} not destroyed, it is HA resource vm:100; pvegpu purges no HA or "
            "replication entry (nothing unlocked or destroyed): remove it from there, then run again"
        ) in held.stderr, held.stderr
        assert "Traceback" not in held.stderr
        assert config.read_text() == "lock: create\n"
        assert token.guest_tasks(pve_name, 100)[0].upid == upid
    finally:
        ledger.forget(pve_name, "qemu", 100)
