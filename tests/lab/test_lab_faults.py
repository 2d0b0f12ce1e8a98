"""Faults on a lab node during deploy/vm.py, and the runs that follow.

The node's pvesh stand-in (and, for one test, its `sync`) is wrapped (the wrapper is the fault; the stand-in
itself stays faithful).

- An HTML page from `GET /cluster/mapping/pci` with exit 0, then a VM create (from the cloud image) whose
  worker dies mid-way (its writes hit RLIMIT_FSIZE: EFBIG, as a full disk or a kill), leaving the stub
  `lock: create` and a task that no longer runs. Asserted: the garbage fails the host in one line naming the
  endpoint, nothing written (no mapping, no image, no VM), no traceback; the killed create is reported with
  its task and "run again" (the next run repairs it: no `qm unlock` by hand), nor taken for an installed VM
  to convert. pvegpu recorded that create before
  it sent it (pvegpu/local/create_records.py): without the record, the next run reports the dead create as not
  provably pvegpu's and leaves it; with it, ONE run (no operator action) unlocks and destroys what the dead
  create left (its volumes too) and creates the VM again, the guest joins the next run's inventory and that
  run changes nothing.
- The image download's worker killed (SIGKILL) after the bytes landed in its temporary file, before the
  rename, then the shell writing the cloud-init user-data snippet killed after staging it, before the
  rename: each run after a cut finishes what the cut left (the download, then the snippet), nothing
  half-written is taken for done (the image's checksum, the snippet's mode), the VM is made and its guest
  reached with pvegpu's login key, and the next run (with the guest, which joins the inventory then) changes
  nothing, downloads nothing.
- Connections cut for real (lab/faults.py, root's login shell on the node): the node's link down for 20 s
  under the mapping sync's first create (outlasted), then pyinfra's own connection cut under the image
  download (the API's runs on), so the next operation's body reads a fact over a dead connection; then the
  API's session frozen 5 s and killed under the VM create. Asserted: no traceback (neither a gevent
  greenlet's nor paramiko's), each faulted run's last line for the node names the step that was cut, that
  nothing after it was written and to run again; one plain run then converges, the next changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator

import pytest

from lab import boot, faults, hosts, images
from lab.pve import node as pve_node
from pvegpu.local.create_records import ledger_beside
from pvegpu.local.guest_keys import GuestPlace, login_key_files
from pvegpu.run.progress import cut_line
from tests.lab.test_lab_vm import START, SYNC, VM, guest_gpus, mappings, prepare_host, run

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
Cli = Callable[..., subprocess.CompletedProcess[str]]

ROLE = "Create and start the Q35 VM | "
STORAGE = ROLE + "Storage local offers import, snippets"
IMAGE = ROLE + "The VM's cloud image is on the node"
SNIPPET = ROLE + "The guest's cloud-init user-data is on the node"
HOOK = ROLE + "The node's pre-start hookscript is installed"
CONVERT = ROLE + "Convert an existing i440FX/SeaBIOS VM to Q35/OVMF"
DISK = ROLE + "The VM's system disk has its size"
KNOWN = ROLE + "The guest's address and host key are known"
PENDING = ROLE + "Apply the VM's pending changes (a cold restart)"
# Once the VM exists the image is not looked at again (it is read once, on create).
SETTLED = dict.fromkeys((SYNC, STORAGE, SNIPPET, HOOK, CONVERT, VM, DISK, START, KNOWN, PENDING), "no_change")
CLOUD_IMAGE = "debian-12-genericcloud-amd64.qcow2"
SNIPPET_PATH = "var/lib/vz/snippets/pvegpu-100-user.yaml"

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
"create /nodes/NODE/storage/local/download-url")
    if [ -e /run/pvegpu-fault-cut-download ]; then
        exec python3 -c 'import os, pathlib, runpy, signal, sys
rename = pathlib.Path.rename
def cut(self, target):
    if ".tmp_dwnl." in self.name:
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(self, target)
pathlib.Path.rename = cut
sys.argv = ["/usr/bin/pvesh", *sys.argv[1:]]
runpy.run_path("/usr/bin/pvesh.real", run_name="__main__")' "$@"
    fi ;;
esac
exec /usr/bin/pvesh.real "$@"
"""
# Kills the shell that runs pvegpu's atomic write of the user-data snippet once it is staged (`sync TEMP`).
SYNC_WRAPPER = """#!/bin/sh
# LAB FAULT WRAPPER around sync (tests/lab/test_lab_faults.py).
case "$*" in
*/.pvegpu-100-user.yaml.pvegpu-new) [ -e /run/pvegpu-fault-cut-snippet ] && kill -9 "$PPID" && exit 137 ;;
esac
exec /usr/bin/sync.real "$@"
"""


@pytest.fixture(autouse=True)
def pvesh_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """The faults are armed in a wrapper around the node's pvesh: the API is reached through it (`ssh`)."""
    monkeypatch.setenv("PVEGPU_LAB_PVE_BACKEND", "ssh")


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"f{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def faulty_node(cli: Cli, monkeypatch: pytest.MonkeyPatch, lab_ssh: Ssh, name: str) -> hosts.LabHost:
    """A reference node, host prepared (GPUs on vfio-pci), its pvesh wrapped by WRAPPER (no fault armed)."""
    node = pve_node.up(name, "reference")
    boot.install(node, "grub")
    prepare_host(cli, monkeypatch, node)
    wrapper = WRAPPER.replace("NODE", name)
    lab_ssh(node, f"mv /usr/bin/pvesh /usr/bin/pvesh.real && cat > /usr/bin/pvesh <<'EOF'\n{wrapper}EOF\n")
    lab_ssh(node, "chmod 755 /usr/bin/pvesh")
    return node


def failing(cli: Cli, node: hosts.LabHost) -> str:
    """stderr of a deploy/vm.py run on `node` that must fail."""
    result = cli("-y", "--limit", node.name, "inventory/lab.py", "deploy/vm.py", check=False)
    assert result.returncode != 0, result.stderr
    return result.stderr


def imports(node: hosts.LabHost) -> list[str]:
    """The files in the node's `local` import directory."""
    directory = node.root / "var/lib/vz/import"
    return sorted(path.name for path in directory.iterdir()) if directory.is_dir() else []


def the_image_is_whole(node: hosts.LabHost) -> None:
    """The node's copy of the cloud image has the checksum the inventory gives."""
    data = (node.root / "var/lib/vz/import" / CLOUD_IMAGE).read_bytes()
    assert hashlib.sha512(data).hexdigest() == images.image_checksum(CLOUD_IMAGE)


def guest_reached(node: hosts.LabHost) -> str:
    """The hostname the VM's guest answers over SSH with pvegpu's login key and strict host key checking."""
    guest = hosts.get_host(f"{node.name}v100")
    login, _ = login_key_files(hosts.known_hosts_path(), GuestPlace(None, None, node.name, 100))
    argv = [
        "ssh", "-i", str(login), "-o", f"UserKnownHostsFile={hosts.known_hosts_path()}",
        "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-F", "/dev/null", f"root@{guest.address}", "hostname",
    ]  # fmt: skip
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout.strip()


def test_drift_garbage_and_a_killed_create_then_one_run_converges(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = faulty_node(pyinfra_cli, monkeypatch, lab_ssh, pve_name)
    lab_ssh(node, "touch /run/pvegpu-fault-html")

    garbage = failing(pyinfra_cli, node)

    assert (
        f"[{pve_name}] PCI mappings not read: GET /cluster/mapping/pci: expected a list, got "
        "'<!DOCTYPE html>'; nothing written\n" in garbage
    )
    assert "Traceback" not in garbage, garbage
    lab_ssh(node, "rm /run/pvegpu-fault-html && touch /run/pvegpu-fault-kill")
    assert mappings(node) == {}
    assert imports(node) == []
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()

    killed = failing(pyinfra_cli, node)

    config = node.root / "etc/pve/qemu-server/100.conf"
    assert config.read_text() == "lock: create\n"
    report = re.search(r"(VM 100 not completely created after .*)", killed)
    assert report is not None, killed
    assert re.fullmatch(
        rf"VM 100 not completely created after POST /nodes/{pve_name}/qemu: .*: VM 100 is locked \(create\); "
        rf"its last task UPID:{pve_name}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:qmcreate:100:root@pam: no "
        r"longer runs \(exit status: unexpected status\): nothing after it was written; run again "
        r"\(it destroys what the create left and creates it\)",
        report[1],
    ), report[1]
    assert len(mappings(node)) == 8  # the sync before the create was whole
    the_image_is_whole(node)  # so was the download

    ledger = ledger_beside(hosts.known_hosts_path(), "root@pam", cluster=None, owner=None, node=pve_name)
    assert ledger is not None
    record = ledger.path(pve_name, "qemu", 100)
    assert json.loads(record.read_text())["upid"] is None  # pvesh never answered the killed POST
    lab_ssh(node, "rm /run/pvegpu-fault-kill && mv /usr/bin/pvesh.real /usr/bin/pvesh")

    # Without pvegpu's record the dead create is not provably pvegpu's: reported, untouched.
    record.rename(record.with_suffix(".away"))
    foreign = failing(pyinfra_cli, node)
    assert re.search(
        rf"\[{pve_name}\] VM 100: the dead create UPID:{pve_name}:[0-9A-F:]+:qmcreate:100:root@pam: is not "
        r"provably pvegpu's: pvegpu has no record of creating it\n",
        foreign,
    ), foreign
    assert f"[{pve_name}] VM 100 is locked (create); its last task UPID:{pve_name}:" in foreign
    assert config.read_text() == "lock: create\n"
    record.with_suffix(".away").rename(record)

    converged, log = run(pyinfra_cli, "deploy/vm.py", node)

    # With it, the next run unlocks and destroys what the dead create left, and creates the VM again.
    assert re.search(
        rf"\[{pve_name}\] VM 100 is locked \(create\) by pvegpu's create task UPID:{pve_name}:[0-9A-F:]+:"
        r"qmcreate:100:root@pam:, which no longer runs \(exit status: unexpected status; it started as "
        r"root@pam within 60 s of pvegpu's POST, which never answered\): removing the lock, destroying what "
        r"it left and creating it again\n",
        log,
    ), log
    assert not record.exists()
    # Nothing of the dead create is left: every volume of VM 100 is one its new config names.
    folders = [node.root / "var/lib/pvegpu-lab/volumes", node.root / "var/lib/vz/images"]
    volumes = sorted(path.name.split(".")[0] for folder in folders for path in folder.rglob("vm-100-*"))
    assert volumes == sorted(set(re.findall(r"vm-100-[\w-]+", config.read_text()))), volumes

    # The image is still there from the killed run: not downloaded again.
    assert converged == {
        **SETTLED,
        IMAGE: "no_change",
        VM: "success",
        DISK: "success",
        START: "success",
        KNOWN: "success",
    }
    assert f"info: guest {pve_name}v100 of {pve_name} is not in this run's inventory" in log
    assert len(guest_gpus(node)) == 8
    assert guest_reached(node) == f"{pve_name}v100"
    settled, log = run(pyinfra_cli, "deploy/vm.py", node, hosts.get_host(f"{pve_name}v100"))
    assert settled == SETTLED
    assert "is not in this run's inventory" not in log


def test_cut_download_then_cut_snippet_write_each_finished_by_the_next_run(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = faulty_node(pyinfra_cli, monkeypatch, lab_ssh, pve_name)
    lab_ssh(
        node, "mv /usr/bin/sync /usr/bin/sync.real && cat > /usr/bin/sync <<'EOF'\n" + SYNC_WRAPPER + "EOF\n"
    )
    lab_ssh(node, "chmod 755 /usr/bin/sync && touch /run/pvegpu-fault-cut-download")
    url = images.image_url(node, CLOUD_IMAGE)

    cut_download = failing(pyinfra_cli, node)

    assert (
        f"[{pve_name}] vm.image.url {url}: not downloaded: "
        f"POST /nodes/{pve_name}/storage/local/download-url: pvesh failed without a message\n"
    ) in cut_download, cut_download
    assert "Traceback" not in cut_download, cut_download
    # The killed task left its temporary file (as wget's would be), which is no volume: no image, no VM.
    [partial] = imports(node)
    assert re.fullmatch(rf"{re.escape(CLOUD_IMAGE)}\.tmp_dwnl\.\d+", partial), partial
    assert not (node.root / SNIPPET_PATH).exists()
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()
    lab_ssh(node, "rm /run/pvegpu-fault-cut-download && touch /run/pvegpu-fault-cut-snippet")

    cut_snippet = failing(pyinfra_cli, node)

    assert (
        f"{SNIPPET} \n    [{pve_name}] Error: executed 2 commands\n" in cut_snippet  # staged, uploaded, cut
    ), cut_snippet
    assert "PRIVATE KEY" not in cut_snippet  # the staged user-data holds the guest's host key: never printed
    # The download was finished; the snippet was staged (root-only: it holds the guest's host key), never
    # renamed into place.
    assert sorted(imports(node)) == sorted([partial, CLOUD_IMAGE])
    the_image_is_whole(node)
    assert not (node.root / SNIPPET_PATH).exists()
    staged = node.root / "var/lib/vz/snippets/.pvegpu-100-user.yaml.pvegpu-new"
    assert oct(staged.stat().st_mode & 0o777) == "0o600"
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()
    lab_ssh(node, "rm /run/pvegpu-fault-cut-snippet")

    converged, log = run(pyinfra_cli, "deploy/vm.py", node)

    assert converged == {
        **SETTLED,
        IMAGE: "no_change",
        SNIPPET: "success",
        HOOK: "success",
        VM: "success",
        DISK: "success",
        START: "success",
        KNOWN: "success",
    }
    assert f"info: guest {pve_name}v100 of {pve_name} is not in this run's inventory" in log
    assert not staged.exists()
    assert oct((node.root / SNIPPET_PATH).stat().st_mode & 0o777) == "0o600"
    assert (node.root / SNIPPET_PATH).read_text().startswith("#cloud-config\n")
    assert len(guest_gpus(node)) == 8
    assert guest_reached(node) == f"{pve_name}v100"
    settled, log = run(pyinfra_cli, "deploy/vm.py", node, hosts.get_host(f"{pve_name}v100"))
    assert settled == SETTLED
    assert "is not in this run's inventory" not in log
    assert sorted(imports(node)) == sorted([partial, CLOUD_IMAGE])  # nothing downloaded again


def last_line(node: hosts.LabHost, output: str) -> str:
    """The last line pyinfra printed for `node`, without its `[node] ` prefix."""
    prefix = f"[{node.name}] "
    return [line.strip()[len(prefix) :] for line in output.splitlines() if line.strip().startswith(prefix)][
        -1
    ]


def test_link_down_frozen_api_and_cut_before_a_fact_read_each_one_line(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = faulty_node(pyinfra_cli, monkeypatch, lab_ssh, pve_name)
    faults.install(node)
    faults.arm(node, "link-down", "pvesh create /cluster/mapping/pci *", "20")
    faults.arm(node, "cut-others", f"pvesh create /nodes/{pve_name}/storage/local/download-url *")

    cut = failing(pyinfra_cli, node)

    assert "Traceback" not in cut, cut
    assert "No hosts remaining!" not in cut.replace("--> pyinfra error: No hosts remaining!", ""), cut
    assert last_line(node, cut) == cut_line(SNIPPET), cut
    assert len(mappings(node)) == 8  # the sync outlasted the link's 20 s down
    the_image_is_whole(node)  # the download ran on over the API's own connection
    assert not (node.root / SNIPPET_PATH).exists()
    faults.arm(node, "freeze", f"pvesh create /nodes/{pve_name}/qemu *", "5")

    frozen = failing(pyinfra_cli, node)

    assert "Traceback" not in frozen, frozen
    assert last_line(node, frozen) == cut_line(VM), frozen
    assert faults.fired(node) == [
        "link-down",
        "cut-others (sshd processes killed: 1)",
        "freeze (sshd processes stopped 5 s, then killed: 1)",
    ]
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()

    converged, log = run(pyinfra_cli, "deploy/vm.py", node)

    assert converged == {
        **SETTLED,
        IMAGE: "no_change",
        VM: "success",
        DISK: "success",
        START: "success",
        KNOWN: "success",
    }
    assert "Traceback" not in log, log
    assert guest_reached(node) == f"{pve_name}v100"
    settled, log = run(pyinfra_cli, "deploy/vm.py", node, hosts.get_host(f"{pve_name}v100"))
    assert settled == SETTLED
