"""A VM's OS from a cloud image, on a Proxmox lab node (the pvesh stand-in's download-url, import-from and
agent; the lab's image server and cloud-init stand-in):

- a wrong checksum stops deploy/vm.py before the VM is made: the error names the URL and both sums; no VM,
  no image file;
- with the right checksum and DHCP: the VM is made from the image, the address the guest agent reports is
  recorded with the guest's host key; the guest then joins the inventory (`guests_of`) and answers pyinfra
  with strict host key checking; a second run changes nothing and downloads nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from lab import hosts, images
from pvegpu.local.guest_keys import GuestPlace, host_key_files, recorded_address

pytestmark = pytest.mark.lab

Cli = Callable[..., subprocess.CompletedProcess[str]]
INVENTORY = "tests/lab/inventories/cloud_vm.py"
IMAGE = "debian-12-genericcloud-amd64.qcow2"
GRAND_TOTAL = re.compile(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.MULTILINE)


@pytest.fixture
def node_name() -> Iterator[str]:
    name = f"ci{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def deploy(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, vm: Mapping[str, object], *args: str
) -> tuple[int, str]:
    monkeypatch.setenv("PVEGPU_LAB_VM_DATA", json.dumps(vm))
    done = cli("-y", INVENTORY, *args, check=False)
    return done.returncode, done.stdout + done.stderr


def download_tasks(node: hosts.LabHost) -> list[Path]:
    return sorted((node.root / "var/log/pve/tasks").rglob("UPID:*:download:*"))


def test_wrong_checksum_stops_before_the_vm_then_dhcp_guest_joins_strictly(
    node_name: str, pyinfra_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    subprocess.run(
        [
            ".venv/bin/python",
            "-m",
            "lab",
            "up",
            node_name,
            "--topology",
            "reference",
            "--pve",
            "--boot",
            "grub",
        ],
        check=True,
        capture_output=True,
    )
    node = hosts.get_host(node_name)
    url = images.image_url(node, IMAGE)
    code, output = deploy(pyinfra_cli, monkeypatch, {}, "deploy/host.py")
    assert code == 0, output

    wrong = "0" * 128
    bad = {"image": {"url": url, "checksum": wrong}, "ipconfig": "ip=dhcp"}
    code, output = deploy(pyinfra_cli, monkeypatch, bad, "deploy/vm.py")
    assert code != 0
    right = images.image_checksum(IMAGE)
    mismatch = f"checksum mismatch: got '{right}' != expect '{wrong}'"
    assert f"[{node_name}] vm.image.url {url}: not downloaded: {mismatch}" in output, output
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()
    assert not (node.root / "var/lib/vz/import" / IMAGE).exists()

    dhcp = {"ipconfig": "ip=dhcp"}
    code, output = deploy(pyinfra_cli, monkeypatch, dhcp, "-vv", "deploy/vm.py")  # -vv: every command shown
    assert code == 0, output
    private, _ = host_key_files(hosts.known_hosts_path(), GuestPlace(None, None, node_name, 100))
    # The user-data holding the guest's private host key went up as a file: no command line showed it.
    body = [line for line in private.read_text().splitlines() if line and not line.startswith("-----")]
    assert body, private
    assert [line for line in body if line in output] == []
    assert "PRIVATE KEY" not in output
    address = recorded_address(private)
    assert address is not None, output
    assert address.startswith("10.200."), output
    assert f"[{node_name}] guest {node_name}v100: {address}, host key recorded" in output, output
    assert address != f"10.200.{node.index + 100}.2"  # DHCP: a lab address of its own, not the static one
    assert len(download_tasks(node)) == 2  # the failed one, then the good one

    # The guest is in the inventory now, reached as root with its login key and its recorded host key.
    code, output = deploy(pyinfra_cli, monkeypatch, dhcp, "exec", "--", "cat /etc/hostname")
    assert code == 0, output
    assert f"[{node_name}v100] {node_name}v100" in output, output

    code, output = deploy(pyinfra_cli, monkeypatch, dhcp, "deploy/vm.py")
    assert code == 0, output
    ops, changed, errors, same = GRAND_TOTAL.findall(output)[0]
    assert (changed, errors, same) == ("-", "-", ops), output
    assert len(download_tasks(node)) == 2  # nothing downloaded again
