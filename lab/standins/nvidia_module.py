#!/usr/bin/python3
"""STAND-IN for loading and unloading the NVIDIA kernel module on a lab host (pvegpu lab).

The stand-in `nvidia-kernel-open-dkms` package ships this as /usr/lib/pvegpu-lab/nvidia-module; its
maintainer scripts run it (a lab host has no module to build or load, so installing the package "loads" it):

    nvidia-module load VERSION    postinst configure: as `modprobe nvidia` would: every NVIDIA display
                                  function (vendor 0x10de, class 0x03xxxx) of the fake sysfs that has no
                                  driver is bound to `nvidia` (one bound to another driver, e.g. vfio-pci, is
                                  never touched), and VERSION_FILE gets what /proc/driver/nvidia/version shows
    nvidia-module unload          prerm remove: as `modprobe -r nvidia`: the functions bound to `nvidia`
                                  lose their driver and VERSION_FILE is removed

VERSION_FILE text (the lab's reboot stand-in writes the same at boot):
    NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  <VERSION>  Release Build  (pvegpu lab STAND-IN)
    GCC version:  none (pvegpu lab STAND-IN)

Settings come from /etc/pvegpu-lab/nvidia.env (`SYSFS_ROOT=`, `VERSION_FILE=`). Binding rewrites the fake
sysfs links the way lab/boot_standins/reboot.py does: `<device>/driver` -> bus/pci/drivers/nvidia and
`bus/pci/drivers/nvidia/<address>` -> the device, both relative.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SETTINGS = Path("/etc/pvegpu-lab/nvidia.env")
NVIDIA, DISPLAY_CLASS = "0x10de", "0x03"
VERSION_TEXT = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(pvegpu lab STAND-IN)\nGCC version:  none (pvegpu lab STAND-IN)\n"
)


# Installed on lab hosts as a lone script, so it reads /etc/pvegpu-lab/nvidia.env itself (as its siblings do).
def settings(path: Path) -> dict[str, str]:
    values = {"SYSFS_ROOT": "/sys", "VERSION_FILE": "/proc/driver/nvidia/version"}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not name.startswith("#"):
                values[name.strip()] = value.strip()
    return values


def nvidia_displays(sysfs: Path) -> list[Path]:
    """The NVIDIA display functions of the tree, in bus order."""
    return [
        device
        for device in sorted((sysfs / "bus/pci/devices").iterdir())
        if (device / "vendor").read_text().strip() == NVIDIA
        and (device / "class").read_text().startswith(DISPLAY_CLASS)
    ]


def driver_of(device: Path) -> str | None:
    link = device / "driver"
    return Path(os.readlink(link)).name if link.is_symlink() else None


def bind_nvidia(sysfs: Path, device: Path) -> None:
    real = device.resolve()
    drivers = sysfs / "bus/pci/drivers/nvidia"
    if not drivers.is_dir():
        drivers.mkdir(parents=True)
        for name in ("bind", "unbind", "new_id", "remove_id"):
            (drivers / name).write_text("")
    (real / "driver").symlink_to(os.path.relpath(drivers, real))
    (drivers / device.name).symlink_to(os.path.relpath(real, drivers))


def unbind_nvidia(sysfs: Path, device: Path) -> None:
    (sysfs / "bus/pci/drivers/nvidia" / device.name).unlink(missing_ok=True)
    (device.resolve() / "driver").unlink()


def load(sysfs: Path, version_file: Path, version: str) -> list[str]:
    """Bind the driverless NVIDIA display functions and write the version file; the addresses bound."""
    bound = []
    for device in nvidia_displays(sysfs):
        if driver_of(device) is None:
            bind_nvidia(sysfs, device)
            bound.append(device.name)
    version_file.parent.mkdir(parents=True, exist_ok=True)
    version_file.write_text(VERSION_TEXT.format(version=version))
    return bound


def unload(sysfs: Path, version_file: Path) -> list[str]:
    """Unbind what `nvidia` drives and remove the version file; the addresses released."""
    released = []
    for device in nvidia_displays(sysfs):
        if driver_of(device) == "nvidia":
            unbind_nvidia(sysfs, device)
            released.append(device.name)
    version_file.unlink(missing_ok=True)
    return released


def main(argv: list[str], config: Path = SETTINGS) -> int:
    values = settings(config)
    sysfs, version_file = Path(values["SYSFS_ROOT"]), Path(values["VERSION_FILE"])
    if len(argv) == 2 and argv[0] == "load":
        bound = load(sysfs, version_file, argv[1])
        print(f"nvidia-module (pvegpu lab STAND-IN): loaded {argv[1]}; bound {','.join(bound) or 'nothing'}")
        return 0
    if argv == ["unload"]:
        released = unload(sysfs, version_file)
        print(f"nvidia-module (pvegpu lab STAND-IN): unloaded; released {','.join(released) or 'nothing'}")
        return 0
    sys.stderr.write("usage: nvidia-module load VERSION | unload (pvegpu lab STAND-IN)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
