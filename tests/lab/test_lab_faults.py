"""Faults on the Proxmox API of a lab node during deploy/vm.py, and the runs that follow.

The node's pvesh stand-in is wrapped for one run (the wrapper is the fault; the stand-in itself stays
faithful): an HTML page from `GET /cluster/mapping/pci` with exit 0, then a VM create whose worker dies
mid-way (its writes hit RLIMIT_FSIZE: EFBIG, as a full disk or a kill), leaving the stub `lock: create`
and a task that no longer runs. Asserted: the garbage fails the host in one line naming the endpoint,
nothing written, no traceback; the killed
create is reported with its task and `qm unlock 100`, never taken over; after the operator's unlock and
removal of the empty stub (what `qm destroy 100` does to a VM without volumes), ONE run converges to a
clean run's state and the next changes nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator

import pytest

from lab import boot, hosts
from lab.pve import node as pve_node
from tests.lab.test_lab_vm import START, SYNC, VM, guest_gpus, mappings, prepare_host, run

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
Cli = Callable[..., subprocess.CompletedProcess[str]]

WRAPPER = """#!/bin/sh
# LAB FAULT WRAPPER around the pvesh stand-in (tests/lab/test_lab_faults.py): not Proxmox, not a stand-in.
case "$1 $2" in
"get /cluster/mapping/pci")
    if [ -e /run/pvegpu-fault-html ]; then
        printf '<!DOCTYPE html>\\n<html><body>502 Bad Gateway</body></html>\\n'
        exit 0
    fi ;;
"create /nodes/NODE/qemu")
    if [ -e /run/pvegpu-fault-kill ]; then
        exec python3 -c 'import os, resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
os.execv("/usr/bin/pvesh.real", ["/usr/bin/pvesh.real", *sys.argv[1:]])' "$@"
    fi ;;
esac
exec /usr/bin/pvesh.real "$@"
"""


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"f{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def failing(cli: Cli, node: hosts.LabHost) -> str:
    """stderr of a deploy/vm.py run on `node` that must fail."""
    result = cli("-y", "--limit", node.name, "inventory/lab.py", "deploy/vm.py", check=False)
    assert result.returncode != 0, result.stderr
    return result.stderr


def test_drift_garbage_and_a_killed_create_then_one_run_converges(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = pve_node.up(pve_name, "reference")
    boot.install(node, "grub")
    prepare_host(pyinfra_cli, monkeypatch, node)
    wrapper = WRAPPER.replace("NODE", pve_name)
    lab_ssh(node, f"mv /usr/bin/pvesh /usr/bin/pvesh.real && cat > /usr/bin/pvesh <<'EOF'\n{wrapper}EOF\n")
    lab_ssh(node, "chmod 755 /usr/bin/pvesh && touch /run/pvegpu-fault-html")

    garbage = failing(pyinfra_cli, node)

    assert (
        f"[{pve_name}] PCI mappings not read: GET /cluster/mapping/pci: expected a list, got "
        "'<!DOCTYPE html>'; nothing written\n" in garbage
    )
    assert "Traceback" not in garbage, garbage
    lab_ssh(node, "rm /run/pvegpu-fault-html && touch /run/pvegpu-fault-kill")
    assert mappings(node) == {}
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()

    killed = failing(pyinfra_cli, node)

    config = node.root / "etc/pve/qemu-server/100.conf"
    assert config.read_text() == "lock: create\n"
    report = re.search(r"(VM 100 not completely created after .*)", killed)
    assert report is not None, killed
    assert re.fullmatch(
        rf"VM 100 not completely created after POST /nodes/{pve_name}/qemu: .*: VM 100 is locked \(create\); "
        rf"its last task UPID:{pve_name}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:qmcreate:100:root@pam: no "
        rf"longer runs \(exit status: unexpected status\): check VM 100 on {pve_name}, remove the lock with "
        r"`qm unlock 100` there, then run again",
        report[1],
    ), report[1]
    assert len(mappings(node)) == 8  # the sync before the create was whole

    lab_ssh(node, "rm /run/pvegpu-fault-kill && mv /usr/bin/pvesh.real /usr/bin/pvesh")
    again = failing(pyinfra_cli, node)  # nothing changed: reported again, not taken over
    assert f"[{pve_name}] VM 100 is locked (create); its last task UPID:{pve_name}:" in again
    assert config.read_text() == "lock: create\n"

    # The operator: `qm unlock 100`, then `qm destroy 100` of what is left (an empty config, no volume).
    lab_ssh(node, f"pvesh set /nodes/{pve_name}/qemu/100/config --delete lock --skiplock 1")
    empty = failing(pyinfra_cli, node)
    assert (
        f"[{pve_name}] VM 100 on {pve_name} was never completely created: its config is empty: pvegpu "
        "does not take it over; remove it (`qm destroy 100`) or finish it by hand, then run again\n" in empty
    )
    lab_ssh(node, "rm /etc/pve/qemu-server/100.conf")

    converged, _ = run(pyinfra_cli, "deploy/vm.py", node)

    assert converged == {SYNC: "no_change", VM: "success", START: "success"}
    assert len(guest_gpus(node)) == 8
    settled, _ = run(pyinfra_cli, "deploy/vm.py", node, hosts.get_host(f"{pve_name}v100"))
    assert settled == {SYNC: "no_change", VM: "no_change", START: "no_change"}
