"""plan/convert.py: which VMs need converting, the conversion's exact steps, the refusals' exact texts; and
plan/vm.py's diff_vm, which leaves a VM's firmware keys to the conversion."""

from __future__ import annotations

import pytest

from pvegpu.models.guest_boot import GuestBoot, GuestFilesystem
from pvegpu.models.pve import GuestConfig, GuestInterface
from pvegpu.models.vm import VmSpec
from pvegpu.operations.convert import backup_command
from pvegpu.plan.convert import (
    Conversion,
    GuestFile,
    Refusal,
    legacy_firmware,
    link_file,
    loader_paths,
    needs_conversion,
    net0_mac,
    os_id,
    plan_conversion,
)
from pvegpu.plan.vm import create_keys, diff_vm, vm_config

DIGEST = "3f786850e387550fdab836ed7e6dc881de23001b"
MAC = "BC:24:11:5E:2A:01"
# An installed VM as Proxmox's GUI creates it for Linux: no machine (i440FX), no bios (SeaBIOS), GPUs on
# the root bus without pcie (conventional PCI passthrough).
SEEDED: dict[str, object] = {
    "name": "llm",
    "ostype": "l26",
    "cores": 16,
    "memory": "65536",
    "scsihw": "virtio-scsi-single",
    "scsi0": "local-lvm:vm-120-disk-0,iothread=1,size=32G",
    "net0": f"virtio={MAC},bridge=vmbr0",
    "hostpci0": "mapping=gpu0",
    "hostpci1": "mapping=gpu1",
    "boot": "order=scsi0;net0",
}
ESP = GuestFilesystem("sda15", "/boot/efi", "vfat")
ROOT = GuestFilesystem("sda1", "/", "ext4")
ENS18 = GuestInterface("ens18", MAC.lower(), ("10.0.0.5/24",))
LOADERS = {"/boot/efi/EFI/BOOT/BOOTX64.EFI": True, "/boot/efi/EFI/debian/grubx64.efi": True}
BOOTABLE = GuestBoot(filesystems=(ROOT, ESP), files=LOADERS, nics=(ENS18,), os_id="debian")
SPEC = VmSpec(vmid=120, cores=16, memory=65536)
CHANGE = {
    "machine": "q35",
    "bios": "ovmf",
    "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=0",
    "hostpci0": "mapping=gpu0,pcie=1",
    "hostpci1": "mapping=gpu1,pcie=1",
}
AGAIN = "run pvegpu again: it checks the guest again and converts it"
INSTALL = (
    "in the guest: `apt-get install grub-efi-amd64-bin`, then `grub-install --target=x86_64-efi "
    "--efi-directory=/boot/efi --bootloader-id=debian --force-extra-removable --no-nvram` (writes "
    "/boot/efi/EFI/BOOT/BOOTX64.EFI and /boot/efi/EFI/debian/grubx64.efi; the BIOS boot stays as it is)"
)


def plan(
    values: dict[str, object] | None = None, boot: GuestBoot = BOOTABLE, running: bool = True
) -> Conversion | Refusal:
    config = GuestConfig(values=dict(SEEDED if values is None else values), digest=DIGEST)
    return plan_conversion(120, "pve1", config, running=running, boot=boot, change=CHANGE)


@pytest.mark.parametrize(
    ("values", "legacy"),
    [
        ({}, ("machine pc", "bios seabios")),
        (
            {"machine": "pc-i440fx-9.2+pve1", "bios": "seabios"},
            ("machine pc-i440fx-9.2+pve1", "bios seabios"),
        ),
        ({"machine": "pc-8.1", "bios": "ovmf"}, ("machine pc-8.1",)),
        ({"machine": "q35"}, ("bios seabios",)),
        ({"machine": "type=pc-q35-9.2+pve1,viommu=virtio", "bios": "ovmf"}, ()),
        ({"machine": "q35", "bios": "ovmf"}, ()),
    ],
)
def test_legacy_firmware_names_what_is_not_q35_ovmf(
    values: dict[str, object], legacy: tuple[str, ...]
) -> None:
    assert legacy_firmware(values) == legacy
    assert needs_conversion(values) is bool(legacy)


def test_guest_reading_helpers() -> None:
    assert (
        os_id('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nID=debian\n')
        == "debian"
    )
    assert os_id('ID="ubuntu"\nID_LIKE=debian\n') == "ubuntu"
    assert os_id("NAME=Something\n") is None
    assert loader_paths("ubuntu") == ("/boot/efi/EFI/BOOT/BOOTX64.EFI", "/boot/efi/EFI/ubuntu/grubx64.efi")
    assert loader_paths(None) == ("/boot/efi/EFI/BOOT/BOOTX64.EFI",)
    assert net0_mac(SEEDED) == "bc:24:11:5e:2a:01"
    assert net0_mac({"net0": "virtio,bridge=vmbr0"}) is None
    assert net0_mac({}) is None


def test_link_file_pins_the_name_by_mac() -> None:
    assert link_file(120, GuestInterface("ens18", "BC:24:11:5E:2A:01", ())) == (
        "# Written by pvegpu before VM 120 moved to Q35: keeps this NIC's name when its PCI address\n"
        "# changes. Safe to keep.\n"
        "[Match]\n"
        "MACAddress=bc:24:11:5e:2a:01\n"
        "\n"
        "[Link]\n"
        "Name=ens18\n"
    )


def test_convert_installed_vm_with_esp() -> None:
    conversion = plan()
    assert isinstance(conversion, Conversion)
    backup = f"/var/lib/pvegpu/backup/120.conf.{DIGEST}"
    assert conversion == Conversion(
        vmid=120,
        conf="/etc/pve/qemu-server/120.conf",
        backup=backup,
        digest=DIGEST,
        link=GuestFile("/etc/systemd/network/10-pvegpu-net0.link", link_file(120, ENS18)),
        set=CHANGE,
        delete=(),
        steps=(
            "pin the NIC name ens18 to net0's MAC bc:24:11:5e:2a:01: write /etc/systemd/network/"
            "10-pvegpu-net0.link in the guest (agent file-write; a guest with systemd older than 251 also "
            "needs `update-initramfs -u`)",
            f"keep the old config: copy /etc/pve/qemu-server/120.conf to {backup} on pve1 (checked against "
            f"digest {DIGEST}; to go back: `qm stop 120`, `cp {backup} /etc/pve/qemu-server/120.conf`)",
            "shut VM 120 down (POST /nodes/pve1/qemu/120/status/shutdown) and wait until it is stopped",
            "set machine q35, bios ovmf, efidisk0 local-lvm:1,efitype=4m,pre-enrolled-keys=0, hostpci0 "
            "mapping=gpu0,pcie=1, hostpci1 mapping=gpu1,pcie=1 (PUT /nodes/pve1/qemu/120/config with digest "
            f"{DIGEST})",
            "start VM 120 on Q35/OVMF (the next step: Start the VM and wait until it runs)",
        ),
    )
    assert backup_command(conversion) == (
        "install -d -m 0700 /var/lib/pvegpu/backup && cp /etc/pve/qemu-server/120.conf "
        f"{backup}.partial && {{ echo '{DIGEST}  {backup}.partial' | sha1sum --check --quiet || "
        f"{{ rm -f {backup}.partial; exit 1; }}; }} && mv {backup}.partial {backup}"
    )


def test_convert_bios_only_needs_no_nic_pin() -> None:
    conversion = plan({**SEEDED, "machine": "q35"})
    assert isinstance(conversion, Conversion)
    assert conversion.link is None
    assert conversion.steps[0].startswith("keep the old config: ")


def test_convert_machine_only_needs_no_esp() -> None:
    conversion = plan({**SEEDED, "bios": "ovmf"}, GuestBoot(filesystems=(ROOT,), nics=(ENS18,)))
    assert isinstance(conversion, Conversion)
    assert conversion.link is not None


def refusal(values: dict[str, object] | None = None, boot: GuestBoot = BOOTABLE, running: bool = True) -> str:
    refused = plan(values, boot, running)
    assert isinstance(refused, Refusal)
    return refused.text


HEAD = "VM 120 (machine pc, bios seabios) is not converted to Q35/OVMF: "


def test_error_stopped_vm_is_not_checked_nor_started() -> None:
    assert refusal(running=False) == (
        f"{HEAD}it is stopped, and its disk is checked through the QEMU guest agent before anything changes; "
        "nothing changed. To convert it:\n"
        "  1. start it with its guest agent running: `qm start 120` on pve1\n"
        f"  2. {AGAIN}"
    )


def test_error_agent_not_configured() -> None:
    boot = GuestBoot(agent_error="GET /nodes/pve1/qemu/120/agent/get-fsinfo: No QEMU guest agent configured")
    assert refusal(boot=boot) == (
        f"{HEAD}its guest agent does not answer (GET /nodes/pve1/qemu/120/agent/get-fsinfo: No QEMU guest "
        "agent configured); nothing changed. To convert it:\n"
        "  1. in the guest: `apt-get install qemu-guest-agent` (Debian/Ubuntu), then `systemctl enable --now "
        "qemu-guest-agent`\n"
        "  2. on pve1: `qm set 120 --agent 1`, then `qm shutdown 120` and `qm start 120` (the agent's "
        "channel is added at start)\n"
        f"  3. {AGAIN}"
    )


def test_error_agent_configured_but_not_running() -> None:
    boot = GuestBoot(agent_error="QEMU guest agent is not running")
    text = refusal({**SEEDED, "agent": "1"}, boot)
    assert text.endswith(
        "To convert it:\n"
        "  1. in the guest: `apt-get install qemu-guest-agent` (Debian/Ubuntu), then `systemctl enable --now "
        f"qemu-guest-agent`\n  2. {AGAIN}"
    )


def test_error_no_esp() -> None:
    boot = GuestBoot(filesystems=(ROOT,), files={}, nics=(ENS18,), os_id="debian")
    assert refusal(boot=boot) == (
        f"{HEAD}its disk has no EFI system partition (no vfat filesystem mounted at /boot/efi), and OVMF "
        "boots only an EFI loader; nothing changed. To convert it:\n"
        "  1. in the guest: add an EFI system partition to its disk (FAT32, 200 MiB or more; GPT type EF00, "
        "or MBR type 0xEF), `mkfs.vfat -F 32` it and mount it at /boot/efi through /etc/fstab\n"
        f"  2. {INSTALL}\n"
        f"  3. {AGAIN}"
    )


def test_error_esp_without_fallback_loader() -> None:
    files = {**LOADERS, "/boot/efi/EFI/BOOT/BOOTX64.EFI": False}
    boot = GuestBoot(filesystems=(ROOT, ESP), files=files, nics=(ENS18,), os_id="debian")
    assert refusal(boot=boot) == (
        f"{HEAD}its EFI system partition (sda15 at /boot/efi) lacks /boot/efi/EFI/BOOT/BOOTX64.EFI (OVMF "
        "with a new, empty EFI vars disk boots /boot/efi/EFI/BOOT/BOOTX64.EFI); nothing changed. To convert "
        f"it:\n  1. {INSTALL}\n  2. {AGAIN}"
    )


def test_error_no_nic_with_net0s_mac() -> None:
    boot = GuestBoot(filesystems=(ESP,), files=LOADERS, nics=(GuestInterface("lo", "00:00:00:00:00:00", ()),))
    assert refusal(boot=boot) == (
        f"{HEAD}the guest shows no network interface with net0's MAC bc:24:11:5e:2a:01, so its name cannot "
        "be pinned before the NIC moves to another PCI address; nothing changed. To convert it:\n"
        "  1. in the guest: check that the NIC with MAC bc:24:11:5e:2a:01 is there (`ip -br link`) and its "
        f"driver loaded\n  2. {AGAIN}"
    )


def test_diff_vm_leaves_firmware_and_gpus_to_the_conversion() -> None:
    config, create = vm_config(SPEC, ("gpu0", "gpu1"), None), create_keys(SPEC)
    change = diff_vm(config, create, SEEDED, "gpu")
    assert not {"machine", "bios", "efidisk0", "hostpci0", "hostpci1"} & set(change.set)
    assert change.delete == ()
    converting = diff_vm(config, create, SEEDED, "gpu", converting=True)
    assert {key: converting.set[key] for key in CHANGE} == CHANGE
    assert diff_vm(config, create, {**SEEDED, **converting.set}, "gpu").changed is False
