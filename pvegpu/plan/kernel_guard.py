"""Does the kernel a host boots next have the NVIDIA module the driver needs? Pure.

The next kernel is the one proxmox-kernel-helper's boot entries default to (`zz-proxmox-boot`): the
one-time pin (`proxmox-boot-tool kernel pin --next-boot`), else the pin, else the newest installed image
(systemd-boot's `proxmox-*` default and GRUB's first entry both take the highest version). It needs a
module of the pinned driver version that DKMS built for it, and a driver branch that builds on its series
(`DRIVER_FLOORS`).
"""

from __future__ import annotations

import re

from pvegpu.models.boot import KernelBoot

# Kernel series -> the oldest NVIDIA driver branch whose DKMS module builds on it, and the source.
DRIVER_FLOORS: dict[tuple[int, int], tuple[int, str]] = {
    (7, 0): (
        595,
        "NVIDIA 590's DKMS module fails to build on Linux 7.0 (Proxmox VE 9.2's kernel), 595 builds",
    ),
}
_PARTS = re.compile(r"[0-9]+|[^0-9]+")


def release_key(release: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key ordering kernel releases as `sort -V` does: `6.8.12-10-pve` after `6.8.12-9-pve`."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in _PARTS.findall(release))


def next_boot_kernel(boot: KernelBoot) -> str | None:
    """The release the host boots next (module docstring); None when no kernel image is installed."""
    if boot.next_pinned is not None:
        return boot.next_pinned
    if boot.pinned is not None:
        return boot.pinned
    return max(boot.installed, key=release_key, default=None)


def _series(release: str) -> tuple[int, int]:
    """`7.0.2-1-pve` -> (7, 0): the release's first two numbers, as `release_key` reads them."""
    numbers = [int(part) for part in _PARTS.findall(release) if part.isdigit()]
    major, minor = [*numbers, 0, 0][:2]
    return major, minor


def kernel_problems(boot: KernelBoot, driver_version: str, *, proxmox: bool) -> tuple[str, ...]:
    """Why the next boot would come up without the NVIDIA module `driver_version`: no kernel image, a driver
    branch below the kernel series' floor, no module DKMS built for it; each with the fix. `proxmox`: the
    host's kernels are Proxmox's (`proxmox-headers-*`, `proxmox-boot-tool kernel pin`)."""
    release = next_boot_kernel(boot)
    if release is None:
        return ("no kernel image in /boot (vmlinuz-*): cannot tell which kernel boots next",)
    headers = f"{'proxmox' if proxmox else 'linux'}-headers-{release}"
    keep = (
        f"or pin the running kernel: proxmox-boot-tool kernel pin {boot.running}"
        if proxmox
        else f"or keep booting {boot.running} (GRUB_DEFAULT)"
    )
    problems = []
    floor = DRIVER_FLOORS.get(_series(release))
    major = int(driver_version.split(".", 1)[0])
    if floor is not None and major < floor[0]:
        problems.append(
            f"kernel {release} (next boot) needs NVIDIA driver {floor[0]} or newer, driver.version is "
            f"{driver_version} ({floor[1]}): raise driver.version, {keep}"
        )
    built = boot.built.get(release, ())
    if driver_version not in built:
        problems.append(
            f"kernel {release} (next boot) has no NVIDIA module {driver_version} built by DKMS (built: "
            f"{', '.join(built) or 'none'}): apt install {headers}, then dkms autoinstall -k {release}; "
            f"{keep}"
        )
    return tuple(problems)


def module_built_anywhere(boot: KernelBoot, driver_version: str) -> bool:
    """Whether DKMS built `driver_version` for any kernel: the driver is installed, so a kernel without it
    is a kernel installed since (what the guard is for), not a driver still to install."""
    return any(driver_version in versions for versions in boot.built.values())


def next_boot_report(
    boot: KernelBoot, driver_version: str, *, proxmox: bool, installed_only: bool = False
) -> tuple[bool, tuple[str, ...]]:
    """The doctor's lines on the next boot: (True, the kernel and its module) when it has the module,
    else (False, `kernel_problems`). `installed_only`: nothing to say, (True, ()), until DKMS built
    `driver_version` for some kernel (a guest whose driver the driver role has yet to install)."""
    if installed_only and not module_built_anywhere(boot, driver_version):
        return True, ()
    problems = kernel_problems(boot, driver_version, proxmox=proxmox)
    if problems:
        return False, problems
    return True, (f"kernel {next_boot_kernel(boot)}: NVIDIA module {driver_version} built by DKMS",)
