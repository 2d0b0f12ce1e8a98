"""Boot layouts for lab nodes: GRUB or systemd-boot, with stand-ins for what a container cannot do.

`install(host, layout)` turns a running lab host into a Proxmox node that boots with `layout`:

- `grub`: /etc/default/grub (Debian's default file, with the Proxmox installer's `quiet`), and a stand-in
  `update-grub` (the real one cannot probe the overlay root device; the stand-in sources the same files and
  writes /boot/grub/grub.cfg as grub-mkconfig would).
- `systemd-boot`: /etc/kernel/cmdline (a ZFS install's), /etc/kernel/proxmox-boot-uuids with one ESP, a
  stand-in `proxmox-boot-tool` (`status`, `refresh` writing the ESP's loader entry; every call recorded) and
  a `mount` wrapper that mounts the lab ESP (a directory) for its /dev/disk/by-uuid path.
- both: a stand-in `update-initramfs` (a lab node has no modules to pack: its /boot/initrd.img-<kernel>
  records the modprobe configuration a real image carries), and a stand-in `reboot` that applies the written
  boot state to the node's running command line and fake sysfs driver links (lab/boot_standins/reboot.py says
  exactly how). The running command line is set to what the layout boots now; the generated boot state
  (grub.cfg or the ESP entry, the initramfs) is generated once by the stand-ins, as an installed host has it.

Stand-ins go to /usr/local/sbin, ahead of /usr/sbin on root's PATH; each says it is a stand-in.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from lab.hosts import LabHost

Layout = Literal["grub", "systemd-boot"]
LAYOUTS: tuple[Layout, ...] = ("grub", "systemd-boot")
KERNEL = "6.8.12-4-pve"
ESP_UUID = "5A1B-2C3D"
ESP_INITRD = rf"\EFI\proxmox\{KERNEL}\initrd.img-{KERNEL}"
# Synthesized, Proxmox VE 8 installer shapes: LVM root with GRUB, ZFS root with systemd-boot.
GRUB_RUNNING = f"BOOT_IMAGE=/boot/vmlinuz-{KERNEL} root=/dev/mapper/pve-root ro quiet"
SYSTEMD_BOOT_CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet"
_STANDINS = Path(__file__).with_name("boot_standins")


def running_cmdline_file(host: LabHost) -> Path:
    """The file (on this machine) that the host sees as its running kernel command line."""
    if host.mode == "netns":
        return host.state_dir / "cmdline"  # bind-mounted over the host's /proc/cmdline
    return host.root / host.cmdline_path.lstrip("/")


def install(host: LabHost, layout: Layout) -> None:
    """Give `host` the boot files of `layout` and the boot stand-ins (module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown boot layout {layout!r}; known: {', '.join(LAYOUTS)}")
    root = host.root
    _write(root / "etc/pvegpu-lab/kernel", f"{KERNEL}\n")
    # The kernel's image, as its package leaves it: what the boot entries and pvegpu's next-boot check read.
    _write(root / f"boot/vmlinuz-{KERNEL}", "pvegpu lab STAND-IN kernel image\n")
    settings = {
        "layout": layout,
        "sysfs_root": host.sysfs_root,
        "cmdline_path": host.cmdline_path,
        "esp_initrd": ESP_INITRD,
    }
    _write(root / "etc/pvegpu-lab/boot.json", json.dumps(settings, indent=1, sort_keys=True) + "\n")
    _standin(root, "reboot.py", "reboot")
    _standin(root, "update-initramfs", "update-initramfs")
    if layout == "grub":
        default = (root / "usr/share/grub/default/grub").read_text()
        _write(root / "etc/default/grub", default)
        _standin(root, "update-grub", "update-grub")
        generate = ["update-grub"]
        running = GRUB_RUNNING
    else:
        _write(root / "etc/kernel/cmdline", f"{SYSTEMD_BOOT_CMDLINE}\n")
        _write(root / "etc/kernel/proxmox-boot-uuids", f"{ESP_UUID}\n")
        _standin(root, "proxmox-boot-tool", "proxmox-boot-tool")
        _standin(root, "mount", "mount")
        generate = ["proxmox-boot-tool", "refresh"]
        running = f"initrd={ESP_INITRD} {SYSTEMD_BOOT_CMDLINE}"
    for argv in (generate, ["update-initramfs", "-u", "-k", "all"]):
        subprocess.run(
            ["chroot", str(root), f"/usr/local/sbin/{argv[0]}", *argv[1:]], check=True, capture_output=True
        )
    for log in (*generate[:1], "update-initramfs"):  # the logs record what pvegpu ran, not the install
        (root / f"var/log/pvegpu-lab/{log}.log").unlink()
    running_cmdline_file(host).write_text(f"{running}\n")


def _write(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


def _standin(root: Path, source: str, name: str) -> None:
    target = root / "usr/local/sbin" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_STANDINS / source, target)
    target.chmod(0o755)
