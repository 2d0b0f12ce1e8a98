"""Pure decisions of the NVIDIA driver role: which CUDA repository, which packages where, whether the
flavour fits the GPUs, whether the loaded module is the pinned one, and what verification found.

Where the driver goes (`Placement`) decides its packages, all from NVIDIA's CUDA repository and pinned to
one build by apt preferences (Debian's own packages are too old for Blackwell):
- `guest` (a VM's guest, a bare-metal Debian/Ubuntu host): `nvidia-open` (kernel module through dkms,
  userspace, persistenced) with `dkms` and the running kernel's `linux-headers-*`.
- `pve-host` (a Proxmox node serving itself or its containers): the same driver, `nvidia-modprobe` (the
  boot unit creates the device nodes with it), and Proxmox's headers: `proxmox-headers-<running kernel>`
  and `proxmox-default-headers`, which follows the default kernel, so dkms builds the module for every
  new Proxmox kernel before it boots. apt + dkms rather than NVIDIA's `.run` installer: dpkg tracks every
  file, the version is held by apt preferences, and the container takes exactly the same build from the
  same repository.
- `container` (an LXC container on the host's module): userspace only, `nvidia-driver-cuda` without
  recommends; an apt preferences file forbids every kernel module package, so apt fails loudly rather
  than ever putting a module (or dkms) into the container.

No I/O. Problems are operator-facing lines naming the `driver.*` field or the host state that is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.nvidia import LoadedModule, NvidiaSmi
from pvegpu.models.specs import HostSpecs
from pvegpu.plan.cmdline import HOST_P2P_PROFILES
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import device_nodes as lxc_device_nodes
from pvegpu.plan.reboot import RebootGuard, reboot_guard

NVIDIA = "10de"
# Blackwell's first device id (GB100/GB102 0x29xx, GB202 0x2Bxx, GB203 0x2Cxx, GB205-207 0x2Dxx-0x2Fxx);
# Hopper (0x23xx) and Ada (0x26xx-0x28xx) are below. NVIDIA supports only open modules on Blackwell.
BLACKWELL_FIRST_DEVICE = 0x2900
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
# os-release ID and VERSION_ID -> the directory name of NVIDIA's CUDA repository.
CUDA_DISTROS = {
    ("debian", "12"): "debian12",
    ("debian", "13"): "debian13",
    ("ubuntu", "22.04"): "ubuntu2204",
    ("ubuntu", "24.04"): "ubuntu2404",
}
PACKAGE = {"open": "nvidia-open", "proprietary": "cuda-drivers"}
USERSPACE_PACKAGE = "nvidia-driver-cuda"
MODULES_LOAD = "/etc/modules-load.d/pvegpu-nvidia.conf"
DEVICES_SERVICE = "pvegpu-nvidia-devices.service"
DEVICES_UNIT = f"/etc/systemd/system/{DEVICES_SERVICE}"
NOUVEAU_DROP_IN = "/etc/modprobe.d/pvegpu-nouveau.conf"
# nvidia_uvm without HMM on the profiles that serve with P2P on the host (lxc, baremetal): NCCL's P2P hangs
# on this GPU otherwise (../shared/knowledge/serving-recipe-glm5-sm120.md, local-inference-lab/rtx6kpro #15).
UVM_OPTIONS = "/etc/modprobe.d/pvegpu-nvidia-uvm.conf"
PREFERENCES = "/etc/apt/preferences.d/pvegpu-nvidia"
PERSISTENCED = "nvidia-persistenced.service"
# Never installed in a container: the module is the host's (Pin-Priority -1 in its apt preferences).
KERNEL_PACKAGES = ("nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "nvidia-open", "cuda-drivers", "dkms")
Placement = Literal["guest", "pve-host", "container"]


@dataclass(frozen=True)
class DriverPlan:
    """What the driver role installs at `placement` on one host, decided before any host is changed: the
    CUDA repository for its distribution, the pinned packages, how many device nodes the boot unit makes
    (`gpus`, a Proxmox node's GPUs: `node.gpus.count` may be unset; 0 elsewhere), whether nvidia_uvm's HMM
    goes off, the guard a reboot of a Proxmox node passes first (None elsewhere), and how many GPUs the
    verification expects."""

    driver: DriverSpec
    placement: Placement
    source_line: str
    list_path: str
    keyring_url: str
    packages: tuple[str, ...]
    gpus: int
    hmm_off: bool
    guard: RebootGuard | None
    gpu_count: int | None  # what nvidia-smi must list (`node.gpus.count`; None: not checked)

    @property
    def container(self) -> bool:
        return self.placement == "container"

    @property
    def device_nodes(self) -> tuple[str, ...]:
        """The device nodes the boot unit makes and the role checks: `/dev/nvidia0..gpus-1` and the control
        nodes (plan/lxc.py `device_nodes`, no capability nodes)."""
        return lxc_device_nodes(self.gpus, ())


def plan_driver(
    specs: HostSpecs, placement: Placement, os_release: Mapping[str, str], kernel: str, gpus: int
) -> DriverPlan:
    """The driver's plan on a host running `kernel` of `os_release` (`/etc/os-release`'s values), with
    `gpus` device nodes for the boot unit; PlanError for bad data the models cannot see alone: the
    proprietary flavour for Blackwell ids, a distribution NVIDIA has no repository for."""
    driver = specs.driver
    problems = flavour_problems(driver, specs.node.gpus.ids)
    if problems:
        raise PlanError("\n".join(problems))
    distro = cuda_distro(os_release.get("ID"), os_release.get("VERSION_ID"))
    return DriverPlan(
        driver=driver,
        placement=placement,
        source_line=apt_source_line(driver, distro),
        list_path=cuda_list_path(distro),
        keyring_url=keyring_url(driver, distro),
        packages=driver_packages(driver, placement, kernel),
        gpus=gpus,
        hmm_off=disables_hmm(placement, specs.node.profile),
        guard=reboot_guard(specs) if placement == "pve-host" else None,
        gpu_count=specs.node.gpus.count,
    )


def disables_hmm(placement: Placement, profile: str) -> bool:
    """Whether the driver at `placement` gets `UVM_OPTIONS`: where its module loads (not a container's) on a
    profile whose GPUs talk P2P on that host."""
    return placement != "container" and profile in HOST_P2P_PROFILES


def driver_packages(driver: DriverSpec, placement: Placement, kernel: str) -> tuple[str, ...]:
    """The apt package arguments for `placement` on a host running `kernel` (module docstring)."""
    pinned = driver.package_version
    if placement == "container":
        return (f"{USERSPACE_PACKAGE}={pinned}",)
    if placement == "pve-host":
        return (
            f"{PACKAGE[driver.flavour]}={pinned}",
            f"nvidia-modprobe={pinned}",
            "dkms",
            f"proxmox-headers-{kernel}",
            "proxmox-default-headers",
        )
    return (f"{PACKAGE[driver.flavour]}={pinned}", "dkms", f"linux-headers-{kernel}")


def cuda_distro(os_id: str | None, version_id: str | None) -> str:
    """`debian`, `12` -> `debian12`; PlanError naming the supported ones for anything else."""
    distro = CUDA_DISTROS.get(((os_id or "").lower(), version_id or ""))
    if distro is None:
        supported = ", ".join(f"{name} {version}" for name, version in CUDA_DISTROS)
        raise PlanError(
            f"{DRIVER_KEY}: {os_id or 'unknown'} {version_id or ''} is not a distribution NVIDIA's CUDA "
            f"repository serves; supported: {supported}"
        )
    return distro


def cuda_list_path(distro: str) -> str:
    """The apt list file of the CUDA repository for `distro` (the name the cuda-keyring package uses)."""
    return f"/etc/apt/sources.list.d/cuda-{distro}-x86_64.list"


def apt_source_line(driver: DriverSpec, distro: str) -> str:
    """The one-line apt source of the CUDA repository, verified with the cuda-keyring key."""
    return f"deb [signed-by={KEYRING}] {driver.repository.replace('{distro}', distro)} /\n"


def keyring_url(driver: DriverSpec, distro: str) -> str:
    return driver.repository.replace("{distro}", distro) + KEYRING_DEB


def is_blackwell(pci_id: str) -> bool:
    vendor, _, device = pci_id.partition(":")
    return vendor == NVIDIA and int(device, 16) >= BLACKWELL_FIRST_DEVICE


def flavour_problems(driver: DriverSpec, gpu_ids: Iterable[str]) -> tuple[str, ...]:
    """`driver.flavour: ...` when the proprietary flavour is asked for Blackwell GPUs."""
    blackwell = sorted(pci_id for pci_id in gpu_ids if is_blackwell(pci_id))
    if driver.flavour == "proprietary" and blackwell:
        return (
            f"{DRIVER_KEY}.flavour: the proprietary kernel module does not support Blackwell GPUs "
            f"({', '.join(blackwell)}); use open",
        )
    return ()


def module_mismatch(driver: DriverSpec, loaded: LoadedModule | None) -> str | None:
    """Why the loaded module is not the pinned one (None when it is)."""
    if loaded is None:
        return f"no NVIDIA kernel module is loaded ({driver.version_file} is absent)"
    if (loaded.flavour, loaded.version) != (driver.flavour, driver.version):
        return (
            f"the loaded kernel module is the {loaded.flavour} {loaded.version}, "
            f"not the pinned {driver.flavour} {driver.version}"
        )
    return None


def container_module_problem(driver: DriverSpec, loaded: LoadedModule | None) -> str | None:
    """In a container the module is the host's: why it cannot serve the pinned userspace (None when it
    can), naming both versions."""
    if loaded is None:
        return (
            f"the host has no NVIDIA kernel module loaded ({driver.version_file} is absent): deploy the "
            f"host (profile lxc) first"
        )
    if (loaded.flavour, loaded.version) != (driver.flavour, driver.version):
        return (
            f"driver version mismatch: host kernel module {loaded.flavour} {loaded.version}, container "
            f"userspace {driver.flavour} {driver.version} ({DRIVER_KEY}.version must be the host "
            f"module's version)"
        )
    return None


def verify_problems(
    driver: DriverSpec, loaded: LoadedModule | None, smi: NvidiaSmi, gpu_count: int | None
) -> tuple[str, ...]:
    """What is wrong after installation: module flavour/version, nvidia-smi's GPU count and version."""
    problems = [reason] if (reason := module_mismatch(driver, loaded)) else []
    if smi.error is not None:
        problems.append(f"nvidia-smi failed: {smi.error}")
    else:
        if gpu_count is not None and len(smi.gpus) != gpu_count:
            problems.append(f"nvidia-smi lists {len(smi.gpus)} GPUs, expected {gpu_count} (node.gpus.count)")
        versions = sorted({gpu.driver_version for gpu in smi.gpus} - {driver.version})
        if versions:
            problems.append(
                f"nvidia-smi reports driver {', '.join(versions)}, not the pinned {driver.version}"
            )
    return tuple(problems)
