"""Moving an installed i440FX/SeaBIOS VM to Q35/OVMF without breaking its boot or its network. Pure.

A VM needs converting when its `machine` is not a Q35 one (absent, `pc`, `pc-i440fx-*`, `pc-X.Y`) or its
`bios` is not `ovmf` (absent = SeaBIOS). Setting those keys in place breaks it: OVMF boots only an EFI
loader, and on Q35 the NIC sits at another PCI address, so its predictable name changes (`ens18` ->
`enp6s18`) and the guest's network config no longer matches. `plan_conversion` decides from the config and
what the guest agent showed of the running guest (models/guest_boot.py):

- `Conversion`: its steps, in order: pin the NIC name by MAC with a systemd `.link` file written in the
  guest (a Q35 move only); keep the old config: a copy of the conf file on the node, named by its digest
  and checked against it (`/var/lib/pvegpu/backup/<vmid>.conf.<digest>`); shut the guest down; PUT the
  Q35/OVMF keys (plan/vm.py's diff, with the digest read before); start it (the role's start step).
  A copy rather than a Proxmox snapshot: a snapshot needs snapshot-capable storage for every disk (raw
  volumes on `dir` or thick LVM refuse it) and rolling it back also rolls back the disk, losing what was
  written since; the copy restores exactly the keys pvegpu changed and works on every storage.
- `Refusal` (nothing is changed): the VM is stopped (the agent cannot be asked), the agent does not answer,
  the disk has no EFI system partition (`vfat` at /boot/efi), the ESP lacks the loader OVMF boots with an
  empty EFI vars disk (`\\EFI\\BOOT\\BOOTX64.EFI`) or the distribution's own one (`\\EFI\\<ID>\\grubx64.efi`),
  or the guest shows no NIC with net0's MAC. Its text ends with the exact steps to take by hand.

systemd >= 251 (Debian 12, Ubuntu 22.10 and later) applies a `.link` name again after the initramfs
renamed the NIC; an older guest also needs `update-initramfs -u` (said in the link step).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.guest_boot import GuestBoot
from pvegpu.models.pve import GuestConfig, GuestInterface

ESP_MOUNT = "/boot/efi"
FALLBACK_LOADER = f"{ESP_MOUNT}/EFI/BOOT/BOOTX64.EFI"  # what OVMF boots with empty EFI vars
OS_RELEASE = "/etc/os-release"
BACKUP_DIR = "/var/lib/pvegpu/backup"
CONF_DIR = "/etc/pve/qemu-server"
LINK_PATH = "/etc/systemd/network/10-pvegpu-net0.link"
CONVERSION_KEYS = ("machine", "bios", "efidisk0")  # with every hostpciN: set only by a conversion
_Q35 = re.compile(r"q35|pc-q35-.*")
_MAC = re.compile(r"(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}")
_OS_ID = re.compile(r"ID=\"?([a-z0-9._-]+)\"?")


def legacy_firmware(values: Mapping[str, object]) -> tuple[str, ...]:
    """What keeps a VM config from being Q35/OVMF: `machine <type>` (shown `pc` when absent) and/or
    `bios <bios>` (`seabios` when absent); empty for a Q35/OVMF VM."""
    machine = str(values.get("machine", "pc")).split(",")[0].removeprefix("type=")
    bios = str(values.get("bios", "seabios"))
    found = [] if _Q35.fullmatch(machine) else [f"machine {machine}"]
    return (*found, *([] if bios == "ovmf" else [f"bios {bios}"]))


def needs_conversion(values: Mapping[str, object]) -> bool:
    """Whether the VM is not (yet) Q35/OVMF: its machine and bios are only changed by a conversion."""
    return bool(legacy_firmware(values))


def os_id(os_release: str) -> str | None:
    """`ID` of an /etc/os-release text (`debian`), None when it has none."""
    for line in os_release.splitlines():
        match = _OS_ID.fullmatch(line.strip())
        if match:
            return match[1]
    return None


def loader_paths(distribution: str | None) -> tuple[str, ...]:
    """The loaders to look for on the ESP: the fallback, and the distribution's (`ID` known)."""
    own = () if distribution is None else (f"{ESP_MOUNT}/EFI/{distribution}/grubx64.efi",)
    return (FALLBACK_LOADER, *own)


def net0_mac(values: Mapping[str, object]) -> str | None:
    """net0's MAC, lowercase (`virtio=BC:24:11:..,bridge=vmbr0`); None without net0 or a MAC."""
    head = str(values.get("net0", "")).split(",")[0]
    mac = head.partition("=")[2]
    return mac.lower() if _MAC.fullmatch(mac) else None


def link_file(vmid: int, nic: GuestInterface) -> str:
    """The systemd .link file that keeps `nic`'s name whatever its PCI address."""
    return (
        f"# Written by pvegpu before VM {vmid} moved to Q35: keeps this NIC's name when its PCI address\n"
        "# changes. Safe to keep.\n"
        "[Match]\n"
        f"MACAddress={nic.mac.lower()}\n"
        "\n"
        "[Link]\n"
        f"Name={nic.name}\n"
    )


@dataclass(frozen=True)
class GuestFile:
    """A file to write in the guest (agent/file-write): its path and exact content."""

    path: str
    content: str


@dataclass(frozen=True)
class Conversion:
    """The move to Q35/OVMF: `steps` are the lines shown (one per command, in order); `link` the NIC pin
    (None when the machine stays); `backup` the conf copy's path on the node, of the config with `digest`;
    `set`/`delete` the config change to PUT with `digest` once the guest is shut down."""

    vmid: int
    conf: str
    backup: str
    digest: str
    link: GuestFile | None
    set: dict[str, str]
    delete: tuple[str, ...]
    steps: tuple[str, ...]


@dataclass(frozen=True)
class Refusal:
    """Why the VM is left as it is, and the exact steps to take by hand; `text` says both."""

    vmid: int
    legacy: tuple[str, ...]
    reason: str
    steps: tuple[str, ...]

    @property
    def text(self) -> str:
        numbered = "".join(f"\n  {n}. {step}" for n, step in enumerate(self.steps, 1))
        return (
            f"VM {self.vmid} ({', '.join(self.legacy)}) is not converted to Q35/OVMF: {self.reason}; "
            f"nothing changed. To convert it:{numbered}"
        )


def plan_conversion(
    vmid: int,
    node: str,
    config: GuestConfig,
    *,
    running: bool,
    boot: GuestBoot,
    change: Mapping[str, str],
    delete: Sequence[str] = (),
) -> Conversion | Refusal:
    """The conversion of VM `vmid` on `node` (`config` needs one: see `needs_conversion`), or why not.

    `running`: its status; `boot`: what its guest agent showed (read only while it runs); `change` /
    `delete`: the Q35/OVMF config change (plan/vm.py's diff_vm with `converting=True`)."""
    values = config.values
    legacy = legacy_firmware(values)
    new_machine = any(item.startswith("machine ") for item in legacy)
    new_bios = any(item.startswith("bios ") for item in legacy)
    again = "run pvegpu again: it checks the guest again and converts it"

    def refuse(reason: str, *steps: str) -> Refusal:
        return Refusal(vmid, legacy, reason, (*steps, again))

    if not running:
        return refuse(
            "it is stopped, and its disk is checked through the QEMU guest agent before anything changes",
            f"start it with its guest agent running: `qm start {vmid}` on {node}",
        )
    if boot.agent_error is not None:
        steps = [
            "in the guest: `apt-get install qemu-guest-agent` (Debian/Ubuntu), then "
            "`systemctl enable --now qemu-guest-agent`"
        ]
        if str(values.get("agent", "0")).split(",")[0].removeprefix("enabled=") not in ("1", "on", "yes"):
            steps.append(
                f"on {node}: `qm set {vmid} --agent 1`, then `qm shutdown {vmid}` and `qm start {vmid}` "
                "(the agent's channel is added at start)"
            )
        return refuse(f"its guest agent does not answer ({boot.agent_error})", *steps)
    esp = next((fs for fs in boot.filesystems if fs.mountpoint == ESP_MOUNT and fs.type == "vfat"), None)
    loaders = loader_paths(boot.os_id)
    distro = boot.os_id or "debian"
    install = (
        f"in the guest: `apt-get install grub-efi-amd64-bin`, then `grub-install --target=x86_64-efi "
        f"--efi-directory={ESP_MOUNT} --bootloader-id={distro} --force-extra-removable --no-nvram` (writes "
        f"{FALLBACK_LOADER} and {ESP_MOUNT}/EFI/{distro}/grubx64.efi; the BIOS boot stays as it is)"
    )
    if new_bios and esp is None:
        return refuse(
            f"its disk has no EFI system partition (no vfat filesystem mounted at {ESP_MOUNT}), and OVMF "
            "boots only an EFI loader",
            "in the guest: add an EFI system partition to its disk (FAT32, 200 MiB or more; GPT type EF00, "
            f"or MBR type 0xEF), `mkfs.vfat -F 32` it and mount it at {ESP_MOUNT} through /etc/fstab",
            install,
        )
    missing = [path for path in loaders if not boot.files.get(path, False)]
    if new_bios and esp is not None and missing:
        return refuse(
            f"its EFI system partition ({esp.name} at {ESP_MOUNT}) lacks {', '.join(missing)}"
            f" (OVMF with a new, empty EFI vars disk boots {FALLBACK_LOADER})",
            install,
        )
    link, steps = None, []
    mac = net0_mac(values)
    if new_machine and mac is not None:
        nic = next((nic for nic in boot.nics if nic.mac.lower() == mac), None)
        if nic is None:
            return refuse(
                f"the guest shows no network interface with net0's MAC {mac}, so its name cannot be pinned "
                "before the NIC moves to another PCI address",
                f"in the guest: check that the NIC with MAC {mac} is there (`ip -br link`) and its driver "
                "loaded",
            )
        link = GuestFile(LINK_PATH, link_file(vmid, nic))
        steps.append(
            f"pin the NIC name {nic.name} to net0's MAC {mac}: write {LINK_PATH} in the guest (agent "
            "file-write; a guest with systemd older than 251 also needs `update-initramfs -u`)"
        )
    conf = f"{CONF_DIR}/{vmid}.conf"
    backup = f"{BACKUP_DIR}/{vmid}.conf.{config.digest}"
    steps += [
        f"keep the old config: copy {conf} to {backup} on {node} (checked against digest "
        f"{config.digest}; to go back: `qm stop {vmid}`, `cp {backup} {conf}`)",
        f"shut VM {vmid} down (POST /nodes/{node}/qemu/{vmid}/status/shutdown) and wait until it is stopped",
        f"set {', '.join(f'{key} {change[key]}' for key in sorted(change, key=_key_order))}"
        + (f"; delete {', '.join(delete)}" if delete else "")
        + f" (PUT /nodes/{node}/qemu/{vmid}/config with digest {config.digest})",
        f"start VM {vmid} on Q35/OVMF (the next step: Start the VM and wait until it runs)",
    ]
    return Conversion(vmid, conf, backup, config.digest, link, dict(change), tuple(delete), tuple(steps))


def _key_order(key: str) -> tuple[int, str]:
    """machine, bios, efidisk0 first (what the conversion is about), then the rest by name."""
    return (CONVERSION_KEYS.index(key), key) if key in CONVERSION_KEYS else (len(CONVERSION_KEYS), key)
