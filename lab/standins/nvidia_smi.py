#!/usr/bin/python3 -IS
"""STAND-IN nvidia-smi (pvegpu lab): lists the NVIDIA display functions of the guest's fake sysfs.

Settings come from /etc/pvegpu-lab/nvidia.env (`SYSFS_ROOT=`, `VERSION_FILE=`), written by the lab when it
starts a guest: the fake sysfs tree plays /sys and VERSION_FILE plays /proc/driver/nvidia/version (the loaded
module, written by the stand-in kernel module package). Like the real tool it refuses to run when no module
is loaded (exit 9), fails with NVML's `Driver/library version mismatch` (exit 18) when its userspace (the
version in its `libnvidia-ml.so.<version>` file name) is not the loaded module's, and numbers GPUs in PCI
bus order. Supported: no arguments, `-L`, and
`--query-gpu=FIELD[,FIELD...] --format=csv[,noheader][,nounits]` for the fields in FIELDS.

It runs in every state read of a serving host, so it starts as a C tool would, not as a Python program: no
site packages (`-IS`), and `os` alone (`re` and `pathlib` took two thirds of its time).
"""

from __future__ import annotations

import os
import sys

SETTINGS = "/etc/pvegpu-lab/nvidia.env"
NVIDIA, DISPLAY_CLASS = "0x10de", "0x03"
NAMES = {"0x2bb1": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
COMPUTE_CAP = {"0x2bb1": "12.0"}
FIELDS = ("index", "name", "pci.bus_id", "driver_version", "uuid", "compute_cap")
MODULE_TAG = "Kernel Module for "
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running. (pvegpu lab STAND-IN)"
)


# Installed on lab hosts as a lone script, so it reads /etc/pvegpu-lab/nvidia.env itself (as its siblings do).
def settings() -> dict[str, str]:
    values = {
        "SYSFS_ROOT": "/sys",
        "VERSION_FILE": "/proc/driver/nvidia/version",
        "NVML_DIR": "/usr/lib/x86_64-linux-gnu",
    }
    if os.path.isfile(SETTINGS):
        for line in read(SETTINGS).splitlines():
            name, sep, value = line.partition("=")
            if sep and not name.startswith("#"):
                values[name.strip()] = value.strip()
    return values


def read(path: str) -> str:
    with open(path) as file:
        return file.read()


def is_version(text: str, major_digits: int | None = None) -> bool:
    """`<major>.<minor>[.<patch>]`, all digits (the major of `major_digits` digits when given)."""
    parts = text.split(".")
    return (
        len(parts) in (2, 3)
        and all(part.isdigit() and part.isascii() for part in parts)
        and (major_digits is None or len(parts[0]) == major_digits)
    )


def module_version(text: str) -> str | None:
    """The version after `Kernel Module for <arch>` in /proc/driver/nvidia/version's text."""
    _, tag, rest = text.partition(MODULE_TAG)
    arch_and_after = rest.split(None, 1)
    if not tag or len(arch_and_after) < 2:
        return None
    after = arch_and_after[1]
    version = after.split(None, 1)[0]
    # Followed by whitespace, as in the real file (the build's name and date, or the line's end).
    return version if is_version(version) and after[len(version) : len(version) + 1].isspace() else None


def gpus(sysfs_root: str) -> list[tuple[str, str]]:
    """(address, device id) of every NVIDIA display function, in bus order."""
    found = []
    devices = os.path.join(sysfs_root, "bus/pci/devices")
    for name in sorted(os.listdir(devices)):
        device = os.path.join(devices, name)
        vendor = read(os.path.join(device, "vendor")).strip()
        if vendor == NVIDIA and read(os.path.join(device, "class")).startswith(DISPLAY_CLASS):
            found.append((name, read(os.path.join(device, "device")).strip()))
    return found


def field(name: str, index: int, address: str, device: str, version: str) -> str:
    domain, rest = address.split(":", 1)
    values = {
        "index": str(index),
        "name": NAMES.get(device, f"NVIDIA Device {device[2:]} (STAND-IN)"),
        "pci.bus_id": f"0000{domain}:{rest}".upper(),
        "driver_version": version,
        "uuid": f"GPU-5ba11ab0-0000-4000-8000-{address.replace(':', '').replace('.', ''):0>12}",
        "compute_cap": COMPUTE_CAP.get(device, "[N/A]"),
    }
    return values[name]


def print_query(names: list[str], form: list[str], found: list[tuple[str, str]], version: str) -> int:
    """`--query-gpu=NAMES --format=FORM`: one CSV line per GPU (after a header unless `noheader`)."""
    for name in names:
        if name not in FIELDS:
            print(f'Field "{name}" is not a valid field to query.\n')
            return 2
    if "csv" not in form:
        print('"--format" is required with "--query-gpu" (STAND-IN supports csv only)')
        return 2
    if "noheader" not in form:
        print(", ".join(names))
    for index, (address, device) in enumerate(found):
        print(", ".join(field(n, index, address, device, version) for n in names))
    return 0


def userspace_version(nvml_dir: str) -> str | None:
    """This userspace's version: the suffix of its `libnvidia-ml.so.<version>` (None without one)."""
    names = os.listdir(nvml_dir) if os.path.isdir(nvml_dir) else []
    for name in sorted(names):
        suffix = name.removeprefix("libnvidia-ml.so.")
        if name.startswith("libnvidia-ml.so.") and is_version(suffix, major_digits=3):
            return suffix
    return None


def main(argv: list[str]) -> int:
    config = settings()
    version_file = config["VERSION_FILE"]
    version = module_version(read(version_file)) if os.path.isfile(version_file) else None
    if version is None:
        print(NO_DRIVER)
        return 9
    userspace = userspace_version(config["NVML_DIR"])
    if userspace is not None and userspace != version:
        # What the real tool prints when its NVML library is not the loaded module's version.
        print("Failed to initialize NVML: Driver/library version mismatch")
        print(f"NVML library version: {userspace}")
        return 18
    found = gpus(config["SYSFS_ROOT"])
    if not found:
        print("No devices were found")
        return 6
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is not None:
        form = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
        return print_query(query.split(","), form.split(","), found, version)
    if argv and argv != ["-L"]:
        print(f"STAND-IN nvidia-smi: unsupported arguments {' '.join(argv)}")
        return 2
    if not argv:
        print(f"NVIDIA-SMI {version} (pvegpu lab STAND-IN)    Driver Version: {version}")
    for index, (address, device) in enumerate(found):
        uuid = field("uuid", index, address, device, version)
        print(f"GPU {index}: {field('name', index, address, device, version)} (UUID: {uuid})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
