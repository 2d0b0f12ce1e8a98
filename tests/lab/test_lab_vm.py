"""deploy/host.py, deploy/vm.py and deploy/rebuild_vm.py against a Proxmox lab node (pvesh stand-in, lab
hypervisor, GRUB boot layout with the reboot stand-in): reference node -> host prepared (GPUs on vfio-pci
after the reboot) -> mappings + VM made from the stand-in cloud image, guest up with 8 GPUs -> no change;
BIOS change (reference-renumbered) and the reboot that follows -> Proxmox's start failure (the VM has no
pre-start hook: `vm.self_heal: off`) -> rebuild repairs, starts, the guest sees 8 GPUs -> no change. And a
mapping edited by someone else between pvegpu's read and its write is not overwritten.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from lab import boot, hosts
from lab.pve import node as pve_node
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.pve import PciMapping, parse_map_entry
from pvegpu.operations.mapping import _update
from pvegpu.plan.vm import nvidia_gpus
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.pve.ssh import ssh_transport

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
Cli = Callable[..., subprocess.CompletedProcess[str]]
HOST_INVENTORY = "tests/lab/inventories/host_role.py"
# inventory/lab.py's nodes and guests; the VM without pvegpu's pre-start hook (`vm.self_heal: off`), so a
# start after the BIOS change fails as Proxmox fails it and deploy/rebuild_vm.py is what repairs.
VM_INVENTORY = "tests/lab/inventories/vm_role.py"


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"h{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def prepare_host(cli: Cli, monkeypatch: pytest.MonkeyPatch, node: hosts.LabHost) -> None:
    """deploy/host.py with reboots allowed; afterwards every GPU function is bound to vfio-pci."""
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps({"pve_host": {"allow_reboot": True}}))
    result = cli("-y", "--limit", node.name, HOST_INVENTORY, "deploy/host.py", check=False)
    assert result.returncode == 0, result.stderr
    manifest = hosts.get_host(node.name).manifest()
    sysfs = node.root / node.sysfs_root.lstrip("/") / "bus/pci/devices"
    functions = [address for gpu in manifest["gpus"] for address in gpu["functions"]]
    assert {(sysfs / address / "driver").readlink().name for address in functions} == {"vfio-pci"}


def run(cli: Cli, deploy: str, *targets: hosts.LabHost, dry: bool = False) -> tuple[dict[str, str], str]:
    """(operation name -> outcome of its one host, stderr) of `pyinfra --json` limited to `targets`."""
    limits = [arg for target in targets for arg in ("--limit", target.name)]
    # --dry without -y: pyinfra then runs change detection (prepares every operation) and stops.
    flags = ["--dry"] if dry else ["--json", "-y"]
    result = cli(*flags, *limits, VM_INVENTORY, deploy, check=False)
    assert result.returncode == 0, result.stderr
    outcome = {}
    results = json.loads(result.stdout)["results"] if not dry else {"operations": []}
    for op in results["operations"]:
        kinds = [kind for kind in ("success", "error", "no_change") if op[kind]]
        outcome[op["name"]] = "+".join(kinds)
    return outcome, result.stderr


def guest_gpus(node: hosts.LabHost) -> tuple[str, ...]:
    """The NVIDIA GPUs the VM's guest shows, read with pvegpu's hardware command on its tree."""
    guest = hosts.get_host(f"{node.name}v100")
    return nvidia_gpus(read_hardware_locally(guest.root / guest.sysfs_root.lstrip("/")))


def mappings(node: hosts.LabHost) -> dict[str, list[tuple[str, int | None]]]:
    """gpuN -> [(path, iommugroup)] as the stand-in holds them."""
    listing: list[dict[str, Any]] = json.loads(
        subprocess.run(
            hosts.ssh_argv(node, "pvesh get /cluster/mapping/pci --output-format json"),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    held = {}
    for item in listing:
        entries = [parse_map_entry(text) for text in item["map"]]
        held[item["id"]] = [(entry.path, entry.iommugroup) for entry in entries]
    return dict(sorted(held.items()))


SYNC = "Sync the PCI mappings | Sync the PCI mappings with the live IOMMU groups"
STORAGE = "Create and start the Q35 VM | Storage local offers import, snippets"
IMAGE = "Create and start the Q35 VM | The VM's cloud image is on the node"
USER_DATA = "Create and start the Q35 VM | The guest's cloud-init user-data is on the node"
CONVERT = "Create and start the Q35 VM | Convert an existing i440FX/SeaBIOS VM to Q35/OVMF"
VM = "Create and start the Q35 VM | Create or converge the Q35 VM"
DISK = "Create and start the Q35 VM | The VM's system disk has its size"
START = "Create and start the Q35 VM | Start the VM and wait until it runs"
KNOWN = "Create and start the Q35 VM | The guest's address and host key are known"
PENDING = "Create and start the Q35 VM | Apply the VM's pending changes (a cold restart)"
GUEST = "Verify the guest's GPUs | Check the guest sees its GPUs"
# deploy/vm.py's operations on a node whose VM exists, all unchanged (vm.self_heal off: no pre-start hook to
# install; the image is only looked for while the VM does not exist).
UNCHANGED = dict.fromkeys((SYNC, STORAGE, USER_DATA, CONVERT, VM, DISK, START, KNOWN, PENDING), "no_change")


def test_vm_deploy_then_bios_renumbered_rebuild(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PVEGPU_LAB_VM_DATA", json.dumps({"self_heal": "off"}))
    node = pve_node.up(pve_name, "reference")
    boot.install(node, "grub")
    prepare_host(pyinfra_cli, monkeypatch, node)
    reference = node.manifest()

    _, dry = run(pyinfra_cli, "deploy/vm.py", node, dry=True)
    assert [line.split("] ", 1)[1] for line in dry.splitlines() if f"{pve_name}: create " in line] == [
        f"gpu{n} {pve_name}: create {gpu['address']} group {gpu['iommu_group']} (10de:2bb1)"
        for n, gpu in enumerate(reference["gpus"])
    ]
    assert mappings(node) == {}  # --dry showed the change and made none
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()

    first, _ = run(pyinfra_cli, "deploy/vm.py", node)

    # Nothing to convert; the rest is made: the image is downloaded, the VM created from it, its disk grown
    # from the image's 2 GiB, started, and its guest answered with the host key pvegpu gave it.
    assert first == {CONVERT: "no_change", PENDING: "no_change"} | dict.fromkeys(
        (SYNC, STORAGE, IMAGE, USER_DATA, VM, DISK, START, KNOWN), "success"
    )
    assert len(guest_gpus(node)) == 8
    assert mappings(node) == {
        f"gpu{n}": [(gpu["address"], gpu["iommu_group"])] for n, gpu in enumerate(reference["gpus"])
    }
    guest = hosts.get_host(f"{pve_name}v100")
    again, _ = run(pyinfra_cli, "deploy/vm.py", node, guest)
    assert again == UNCHANGED

    lab_ssh(node, f"pvesh create /nodes/{pve_name}/qemu/100/status/stop")
    hosts.retopo(pve_name, "reference-renumbered")  # the BIOS change; the node then boots again:
    prepare_host(pyinfra_cli, monkeypatch, node)
    renumbered = hosts.get_host(pve_name).manifest()
    moved_to = renumbered["devices"][f"{reference['gpus'][0]['address']}.0"]["iommu_group"]
    start = subprocess.run(
        hosts.ssh_argv(node, f"pvesh create /nodes/{pve_name}/qemu/100/status/start"),
        check=False,
        capture_output=True,
        text=True,
    )
    assert (start.returncode, start.stderr) == (
        0,
        "PCI device mapping invalid (hardware probably changed): "
        f"'iommugroup' does not match for 'gpu0' ({moved_to} != {reference['gpus'][0]['iommu_group']}) \n",
    )

    rebuild, log = run(pyinfra_cli, "deploy/rebuild_vm.py", node)

    assert rebuild == UNCHANGED | {SYNC: "success", START: "success"}
    # pyinfra pads `[host]` to the inventory's longest name (the guest's, now that it exists).
    changed = [line.split("] ", 1)[1].lstrip() for line in log.splitlines() if " -> " in line]
    assert changed == [
        f"gpu{n} {pve_name}: {old['address']} group {old['iommu_group']} (10de:2bb1) -> "
        f"{new['address']} group {new['iommu_group']} (10de:2bb1)"
        for n, (old, new) in enumerate(zip(reference["gpus"], renumbered["gpus"], strict=True))
    ]
    assert mappings(node) == {
        f"gpu{n}": [(gpu["address"], gpu["iommu_group"])] for n, gpu in enumerate(renumbered["gpus"])
    }
    assert len(guest_gpus(node)) == 8
    guest = hosts.get_host(f"{pve_name}v100")
    settled, _ = run(pyinfra_cli, "deploy/rebuild_vm.py", node, guest)
    assert settled == UNCHANGED | {GUEST: "no_change"}


def test_error_mapping_edited_by_someone_else_is_not_overwritten(pve_name: str, lab_ssh: Ssh) -> None:
    node = pve_node.up(pve_name, "reference")
    ours = f"id=10de:2bb1,node={pve_name},path=0000:41:00,iommugroup=14,subsystem-id=10de:204b"
    theirs = ours.replace("iommugroup=14", "iommugroup=99")
    lab_ssh(node, f"pvesh create /cluster/mapping/pci --id gpu0 --map {ours.replace('=14', '=13')}")
    api = PveClient(
        ssh_transport(node.address, key_filename=str(node.key), known_hosts=str(hosts.known_hosts_path()))
    )
    read = api.mapping("gpu0")
    assert read is not None
    lab_ssh(node, f"pvesh set /cluster/mapping/pci/gpu0 --map {theirs}")  # someone else, after our read

    with pytest.raises(PveError) as refused:
        api.update_mapping(PciMapping("gpu0", (ours,)), read.digest)
    with pytest.raises(OperationError) as not_again:  # the operation's write step re-reads and compares first
        _update(api, PciMapping("gpu0", (ours,)), read.mapping.map)

    assert refused.value.message == (
        "update hardware mapping failed: "
        "detected modified configuration - file changed by other user? Try again."
    )
    assert str(not_again.value) == (
        f"mapping gpu0 changed since pvegpu read it (now ['{theirs}']): not overwritten; run again"
    )
    assert mappings(node) == {"gpu0": [("0000:41:00", 99)]}
    assert Path(node.root / "etc/pve/mapping/pci.cfg").read_text() == f"gpu0\n\tmap {theirs}\n\n"
