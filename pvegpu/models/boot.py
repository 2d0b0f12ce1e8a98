"""How a host boots, as observed: which bootloader owns the kernel command line, and the Proxmox release.

Plain frozen data: no parsing, no I/O (the facts in `pvegpu.facts.boot` fill these).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum


class BootLoaderKind(Enum):
    """Which bootloader the next boot uses, so which file holds the kernel command line.

    GRUB: `/etc/default/grub` (+ `grub.d/*.cfg`). SYSTEMD_BOOT: `/etc/kernel/cmdline`, copied to the ESPs by
    `proxmox-boot-tool refresh`. UNKNOWN: the evidence did not decide; nothing may be written.
    """

    GRUB = "grub"
    SYSTEMD_BOOT = "systemd-boot"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class BootLoaderInfo:
    """The detected bootloader and what it was detected from.

    `esp_uuids` are the ESPs listed in /etc/kernel/proxmox-boot-uuids (empty: not managed by
    proxmox-boot-tool). `evidence` holds one sentence per observation, in the order they were weighed.
    """

    kind: BootLoaderKind
    esp_uuids: tuple[str, ...]
    kernel_cmdline_file: bool
    evidence: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        """JSON-able form; pyinfra's `fact` command prints facts through `to_json`."""
        return {**asdict(self), "kind": self.kind.value}


@dataclass(frozen=True)
class PveRelease:
    """`pveversion`: `pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.12-1-pve)`."""

    manager_version: str
    build: str
    running_kernel: str

    @property
    def major_minor(self) -> tuple[int, int]:
        """`8.2.4` -> (8, 2); a missing or non-numeric minor is 0."""
        major, _, rest = self.manager_version.partition(".")
        minor = rest.split(".", 1)[0]
        return int(major), int(minor) if minor.isdigit() else 0

    def to_json(self) -> dict[str, object]:
        """JSON-able form; pyinfra's `fact` command prints facts through `to_json`."""
        return asdict(self)


@dataclass(frozen=True)
class CpuKernel:
    """What the node's plans need of the CPU, kernel and hypervisor: `amd`/`intel` (None: no `vendor_id`, not
    x86), the running kernel's (major, minor), the CPU's physical address bits (`address sizes`; None: not
    shown) and the installed qemu-server's (major, minor, patch) (None: not installed, as in the lab)."""

    vendor: str | None
    release: tuple[int, int]
    phys_bits: int | None = None
    qemu_server: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class KernelBoot:
    """Which kernels a host can boot and which have the NVIDIA module built, as observed (`pvegpu.facts.
    next_boot`): `running` (`uname -r`), `installed` (`/boot/vmlinuz-<release>`), `pinned` and
    `next_pinned` (the first lines of proxmox-boot-tool's /etc/kernel/proxmox-boot-pin and
    /etc/kernel/next-boot-pin; None: no pin), and `built`: per kernel release, the NVIDIA module versions
    DKMS built for it (`/var/lib/dkms/nvidia*/<version>/<release>/<arch>/module`)."""

    running: str
    installed: tuple[str, ...]
    pinned: str | None
    next_pinned: str | None
    built: dict[str, tuple[str, ...]]
