#!/usr/bin/python3
"""LAB STAND-IN for `reboot` on a pvegpu lab node (installed as /usr/local/sbin/reboot by lab/boot.py).

A lab node cannot boot a kernel, so "rebooting" applies what the next boot would pick up to the node's
fake running state, from the files the bootloader and modprobe would really read:

- kernel command line: GRUB layout: the `linux` line of /boot/grub/grub.cfg (written by update-grub);
  systemd-boot layout: the options proxmox-boot-tool copied to the ESP at its last `refresh`. Without
  those (never refreshed), the command line stays as it was, as on a real host.
- drivers: when vfio-pci loads at boot (vfio_pci in /etc/modules-load.d/*.conf) and the IOMMU is on
  (`amd_iommu=on` / `intel_iommu=on` on the new command line), every function matching
  `options vfio-pci ids=` or an address in an `install vfio-pci` driver_override line is bound to vfio-pci
  (the fake sysfs `driver` links are rewritten). A function bound to vfio-pci that the configuration no
  longer selects (the `lxc` / `baremetal` profiles removed it) gets its own driver back, as a boot without
  vfio-pci gives it: an NVIDIA display function `nvidia` when the host driver is installed (dpkg knows
  `nvidia-kernel-open-dkms` or `nvidia-kernel-dkms`, or an nvidia.ko is under /lib/modules) and no
  modprobe.d file blacklists `nvidia`, else no driver; an HD audio function `snd_hda_intel`; anything
  else no driver. Other functions keep their driver.

Settings come from /etc/pvegpu-lab/boot.json (layout, sysfs_root, cmdline_path, kernel image names).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

CONFIG = Path("/etc/pvegpu-lab/boot.json")
ESP_CMDLINE = Path("/var/lib/pvegpu-lab/esp/cmdline")
GRUB_CFG = Path("/boot/grub/grub.cfg")
LOG = Path("/var/log/pvegpu-lab/reboot.log")
_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def next_cmdline(config: dict[str, str], running: str) -> str:
    if config["layout"] == "grub":
        if not GRUB_CFG.is_file():
            return running
        for line in GRUB_CFG.read_text().splitlines():
            words = line.split()
            if words[:1] == ["linux"]:
                return " ".join([f"BOOT_IMAGE={words[1]}", *words[2:]])
        return running
    if not ESP_CMDLINE.is_file():
        return running
    return f"initrd={config['esp_initrd']} {ESP_CMDLINE.read_text().strip()}"


def vfio_selection() -> tuple[set[str], set[str], bool]:
    """(ids, addresses, vfio-pci loads at boot) from modules-load.d and modprobe.d."""
    loads = any(
        line.strip() in ("vfio_pci", "vfio-pci")
        for conf in Path("/etc/modules-load.d").glob("*.conf")
        for line in conf.read_text().splitlines()
    )
    ids: set[str] = set()
    addresses: set[str] = set()
    for conf in sorted(Path("/etc/modprobe.d").glob("*.conf")):
        for line in conf.read_text().splitlines():
            words = line.split()
            if words[:2] == ["options", "vfio-pci"]:
                for word in words[2:]:
                    if word.startswith("ids="):
                        ids.update(word[len("ids=") :].split(","))
            elif words[:2] == ["install", "vfio-pci"] and "driver_override" in line:
                addresses.update(_ADDRESS.findall(line))
    return ids, addresses, loads


NVIDIA = "0x10de"
DISPLAY_CLASS = "0x03"
AUDIO_CLASS = "0x0403"
DKMS_PACKAGES = ("nvidia-kernel-open-dkms", "nvidia-kernel-dkms")


def host_driver_loads() -> bool:
    """Whether `nvidia` would load at boot: its module installed and no modprobe.d blacklist for it."""
    installed = any(Path(f"/var/lib/dpkg/info/{name}.list").is_file() for name in DKMS_PACKAGES) or any(
        Path("/lib/modules").glob("*/**/nvidia.ko*")
    )
    blacklisted = any(
        line.split() == ["blacklist", "nvidia"]
        for conf in Path("/etc/modprobe.d").glob("*.conf")
        for line in conf.read_text().splitlines()
    )
    return installed and not blacklisted


def own_driver(device: Path, nvidia: bool) -> str | None:
    """The driver a function gets at a boot without vfio-pci (module docstring)."""
    vendor = (device / "vendor").read_text().strip()
    pci_class = (device / "class").read_text().strip()
    if vendor == NVIDIA and pci_class.startswith(DISPLAY_CLASS):
        return "nvidia" if nvidia else None
    if pci_class.startswith(AUDIO_CLASS):
        return "snd_hda_intel"
    return None


def current_driver(device: Path) -> str | None:
    link = device / "driver"
    return Path(os.readlink(link)).name if link.is_symlink() else None


def unbind(sysfs: Path, address: str) -> None:
    device = (sysfs / "bus/pci/devices" / address).resolve()
    link = device / "driver"
    if link.is_symlink():
        old = Path(os.readlink(link)).name
        (sysfs / "bus/pci/drivers" / old / address).unlink(missing_ok=True)
        link.unlink()


def bind(sysfs: Path, address: str, driver: str) -> None:
    device = (sysfs / "bus/pci/devices" / address).resolve()
    link = device / "driver"
    unbind(sysfs, address)
    drivers = sysfs / "bus/pci/drivers" / driver
    if not drivers.is_dir():
        drivers.mkdir(parents=True)
        for name in ("bind", "unbind", "new_id", "remove_id"):
            (drivers / name).write_text("")
    link.symlink_to(os.path.relpath(drivers, device))
    (drivers / address).symlink_to(os.path.relpath(device, drivers))


def main() -> int:
    config = json.loads(CONFIG.read_text())
    cmdline_path = Path(config["cmdline_path"])
    sysfs = Path(config["sysfs_root"])
    cmdline = next_cmdline(config, cmdline_path.read_text().strip())
    cmdline_path.write_text(cmdline + "\n")
    tokens = cmdline.split()
    iommu = "amd_iommu=on" in tokens or "intel_iommu=on" in tokens
    ids, addresses, loads = vfio_selection()
    nvidia = host_driver_loads()
    bound = []
    released = []
    for device in sorted((sysfs / "bus/pci/devices").iterdir()):
        pci_id = (
            f"{(device / 'vendor').read_text().strip()[2:]}:{(device / 'device').read_text().strip()[2:]}"
        )
        if loads and iommu and (pci_id in ids or device.name in addresses):
            bind(sysfs, device.name, "vfio-pci")
            bound.append(device.name)
        elif current_driver(device) == "vfio-pci":
            driver = own_driver(device, nvidia)
            if driver is None:
                unbind(sysfs, device.name)
            else:
                bind(sysfs, device.name, driver)
            released.append(f"{device.name}:{driver or '-'}")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        log.write(
            f"reboot: cmdline={cmdline!r} vfio-pci={','.join(bound) or '-'}"
            + (f" released={','.join(released)}" if released else "")
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
