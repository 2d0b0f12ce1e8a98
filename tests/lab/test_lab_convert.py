"""deploy/vm.py on a Proxmox lab node holding an installed i440FX/SeaBIOS VM (`python -m lab seed-vm`): the
reference user's own starting point.

With an EFI system partition: the first run makes the mappings and refuses the stopped VM (its disk is
checked through the guest agent first); once it runs, `--dry` shows the conversion step by step and changes
nothing; a run converts it (conf copy kept, Q35/OVMF, GPUs as PCIe) and the VM comes back up with its GPUs
and network; another run changes nothing. Without one: nothing changes, and the steps are printed exactly.
The node's `vm` is inventory/lab.py's, `image` included (the shape pvegpu ships): the VM exists already and
was not made from the image, so nothing of the image applies to it (no download, no cloud-init keys).
The installed VM is the operator's own, without pvegpu's mark: its inventory says `vm.adopt: true`, and the
conversion's PUT writes the mark (the tag `pvegpu`, `pvegpu-owner: <node>` in its description), so the run
after it changes nothing. (The lab's guest disk does not keep what the guest wrote across a restart, so the
NIC pin written in the guest is checked by the unit tests, not here.)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator

import pytest

from lab import boot, hosts
from lab.pve import node as pve_node
from lab.pve import seed
from tests.lab.test_lab_vm import START, SYNC, VM, VM_INVENTORY, Cli, guest_gpus, prepare_host, run

pytestmark = pytest.mark.lab

Ssh = Callable[[hosts.LabHost, str], str]
CONVERT = "Create and start the Q35 VM | Convert an existing i440FX/SeaBIOS VM to Q35/OVMF"
VMID = 100


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"c{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def seeded_and_started(
    name: str, cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch, esp: bool
) -> hosts.LabHost:
    """A reference node with vfio binding in effect, the installed VM seeded; deploy/vm.py makes the mappings
    and refuses the stopped VM; the operator starts it: its guest runs on i440FX with the 8 GPUs. The
    inventory adopts the VM (`vm.adopt: true`): it is the operator's, not made by pvegpu."""
    monkeypatch.setenv("PVEGPU_LAB_VM_DATA", json.dumps({"adopt": True}))
    node = pve_node.up(name, "reference")
    boot.install(node, "grub")
    prepare_host(cli, monkeypatch, node)
    seed.seed_vm(node.name, VMID, esp=esp)
    seeded = conf_text(node)

    refused = cli("-y", "--limit", node.name, VM_INVENTORY, "deploy/vm.py", check=False)

    assert refused.returncode != 0
    assert (
        f"VM {VMID} (machine pc, bios seabios) is not converted to Q35/OVMF: it is stopped, and its disk is "
        "checked through the QEMU guest agent before anything changes; nothing changed. To convert it:\n"
        f"  1. start it with its guest agent running: `qm start {VMID}` on {node.name}\n"
    ) in refused.stderr
    assert conf_text(node) == seeded
    lab_ssh(node, f"pvesh create /nodes/{node.name}/qemu/{VMID}/status/start")
    guest = hosts.get_host(f"{node.name}v{VMID}")
    piix3 = guest.root / guest.sysfs_root.lstrip("/") / "bus/pci/devices/0000:00:01.0/device"
    assert piix3.read_text() == "0x7000\n"  # an i440FX guest
    assert len(guest_gpus(node)) == 8
    return node


def conf_text(node: hosts.LabHost) -> str:
    return (node.root / f"etc/pve/qemu-server/{VMID}.conf").read_text()


def status(lab_ssh: Ssh, node: hosts.LabHost) -> str:
    return lab_ssh(node, f"pvesh get /nodes/{node.name}/qemu/{VMID}/status/current --output-format json")


def test_installed_vm_with_esp_is_converted(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = seeded_and_started(pve_name, pyinfra_cli, lab_ssh, monkeypatch, esp=True)
    seeded = conf_text(node)
    digest = hashlib.sha1(seeded.encode()).hexdigest()
    backup = f"/var/lib/pvegpu/backup/{VMID}.conf.{digest}"
    mac = seed.mac_of(node.name, VMID).lower()

    _, dry = run(pyinfra_cli, "deploy/vm.py", node, dry=True)

    steps = [line.split("] ", 1)[1].strip() for line in dry.splitlines() if f"VM {VMID} step " in line]
    assert steps[:3] == [
        f"VM {VMID} step 1: pin the NIC name ens18 to net0's MAC {mac}: write /etc/systemd/network/"
        "10-pvegpu-net0.link in the guest (agent file-write; a guest with systemd older than 251 also needs "
        "`update-initramfs -u`)",
        f"VM {VMID} step 2: keep the old config: copy /etc/pve/qemu-server/{VMID}.conf to {backup} on "
        f"{node.name} (checked against digest {digest}; to go back: `qm stop {VMID}`, `cp {backup} "
        f"/etc/pve/qemu-server/{VMID}.conf`)",
        f"VM {VMID} step 3: shut VM {VMID} down (POST /nodes/{node.name}/qemu/{VMID}/status/shutdown) and "
        "wait until it is stopped",
    ]
    assert steps[3].startswith(
        f"VM {VMID} step 4: set machine q35, bios ovmf, efidisk0 local-lvm:1,efitype=4m,pre-enrolled-keys=0, "
    )
    assert "hostpci7 mapping=gpu7,pcie=1" in steps[3]
    assert f"description pvegpu-owner: {node.name}, " in steps[3]  # adopted: the PUT writes pvegpu's mark
    assert ", tags pvegpu" in steps[3]
    assert steps[4:] == [
        f"VM {VMID} step 5: start VM {VMID} on Q35/OVMF (the next step: Start the VM and wait until it runs)"
    ]
    assert conf_text(node) == seeded  # --dry changed nothing
    assert not (node.root / backup.lstrip("/")).exists()
    assert '"status":"running"' in status(lab_ssh, node).replace(" ", "")

    converted, _ = run(pyinfra_cli, "deploy/vm.py", node)

    assert (converted[SYNC], converted[CONVERT], converted[START]) == ("no_change", "success", "success")
    assert (node.root / backup.lstrip("/")).read_text() == seeded
    conf = conf_text(node)
    assert "machine: q35\n" in conf
    assert "bios: ovmf\n" in conf
    # pvegpu's mark, written by the conversion (the description is comment lines, `:` encoded as Proxmox does)
    assert conf.startswith(f"#pvegpu-owner%3A {node.name}\n")
    assert "tags: pvegpu\n" in conf
    assert f"efidisk0: local-lvm:vm-{VMID}-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M\n" in conf
    assert [line for line in conf.splitlines() if line.startswith("hostpci")] == [
        f"hostpci{n}: mapping=gpu{n},pcie=1" for n in range(8)
    ]
    guest = hosts.get_host(f"{node.name}v{VMID}")
    root_port = guest.root / guest.sysfs_root.lstrip("/") / "bus/pci/devices/0000:00:1c.0/device"
    assert root_port.read_text() == "0x000c\n"  # a Q35 guest: the GPUs behind PCIe root ports
    assert len(guest_gpus(node)) == 8
    agent = lab_ssh(node, f"pvesh get /nodes/{node.name}/qemu/{VMID}/agent/network-get-interfaces")
    assert mac in agent  # its network: the agent answers with net0's NIC

    again, _ = run(pyinfra_cli, "deploy/vm.py", node, guest)

    assert (again[SYNC], again[CONVERT], again[VM], again[START]) == ("no_change",) * 4


def test_error_installed_vm_without_esp_is_left_as_it_is(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = seeded_and_started(pve_name, pyinfra_cli, lab_ssh, monkeypatch, esp=False)
    seeded = conf_text(node)

    for flags in (["--dry"], ["-y"]):
        refused = pyinfra_cli(*flags, "--limit", node.name, VM_INVENTORY, "deploy/vm.py", check=False)

        assert refused.returncode != 0
        assert (
            f"VM {VMID} (machine pc, bios seabios) is not converted to Q35/OVMF: its disk has no EFI system "
            "partition (no vfat filesystem mounted at /boot/efi), and OVMF boots only an EFI loader; nothing "
            "changed. To convert it:\n"
            "  1. in the guest: add an EFI system partition to its disk (FAT32, 200 MiB or more; GPT type "
            "EF00, or MBR type 0xEF), `mkfs.vfat -F 32` it and mount it at /boot/efi through /etc/fstab\n"
            "  2. in the guest: `apt-get install grub-efi-amd64-bin`, then `grub-install --target=x86_64-efi "
            "--efi-directory=/boot/efi --bootloader-id=debian --force-extra-removable --no-nvram` (writes "
            "/boot/efi/EFI/BOOT/BOOTX64.EFI and /boot/efi/EFI/debian/grubx64.efi; the BIOS boot stays as it "
            "is)\n"
            "  3. run pvegpu again: it checks the guest again and converts it"
        ) in refused.stderr
        assert conf_text(node) == seeded
        assert not (node.root / "var/lib/pvegpu/backup").exists()
        assert '"status":"running"' in status(lab_ssh, node).replace(" ", "")
