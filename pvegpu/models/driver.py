"""The NVIDIA driver an operator declares for a serving host (VM guest, container, the host): key `driver`.

    ("gpu-vm", {"node": {...}, "driver": {"version": "580.95.05", "allow_reboot": True}})

Refused at inventory validation, naming the field: a version below `DRIVER_FLOOR` (the pinned SGLang's
CUDA 13 runtime needs it), a malformed version or repository URL. The proprietary flavour on Blackwell GPUs
is refused by `pvegpu.plan.guest.check_guest`, which also sees the node's GPU ids.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from pvegpu.models.fields import AbsolutePath, shown
from pvegpu.models.sglang_options import SGLANG_VERSION

DRIVER_KEY = "driver"
# SGLang 0.5.23 pins torch 2.14.1, which brings the CUDA 13.0 runtime; CUDA 13.0 GA needs driver >= 580.65.06
# (CUDA release notes, table 3; shared/knowledge/sglang-nccl-drivers-lxc-bios.md section 4.1).
DRIVER_FLOOR = (580, 65, 6)
DRIVER_FLOOR_TEXT = "580.65.06"
CUDA_REPOSITORY = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/"

_VERSION = re.compile(r"(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?")
_REVISION = re.compile(r"[0-9A-Za-z.+~-]+")
_URL = re.compile(r"(https?://[^\s/]+|file:)/[^\s\"'\\]*/")


def version_tuple(version: str) -> tuple[int, ...]:
    """`580.95.05` -> (580, 95, 5); ValueError for anything but NNN.N[.N]."""
    match = _VERSION.fullmatch(version)
    if match is None:
        raise ValueError(f"{shown(version)} is not an NVIDIA driver version like 580.95.05")
    return tuple(int(part) for part in match.groups() if part is not None)


class DriverSpec(BaseModel):
    """The NVIDIA driver: which branch and build, where apt gets it, whether pvegpu may reboot for it."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    version: str = Field(
        default="580.95.05",
        description=(
            f"NVIDIA driver version to install and pin (`nvidia-open=<version>-<revision>`); at least "
            f"{DRIVER_FLOOR_TEXT}, the CUDA 13 floor of SGLang {SGLANG_VERSION}."
        ),
    )
    revision: str = Field(
        default="1",
        description="Debian revision of NVIDIA's package (`580.95.05-1` in the CUDA repository: `1`).",
    )
    flavour: Literal["open", "proprietary"] = Field(
        default="open",
        description=(
            "Kernel module flavour: `open` (required for Blackwell, the default since R560) or `proprietary`."
        ),
    )
    repository: str = Field(
        default=CUDA_REPOSITORY,
        description=(
            "Flat apt repository of NVIDIA's packages, ending in `/`; `{distro}` becomes `debian12`, "
            "`debian13`, `ubuntu2204` or `ubuntu2404`. An offline mirror or the lab's `file:` repository "
            "works; it must serve `cuda-keyring_1.1-1_all.deb` and be signed by the key that installs."
        ),
    )
    allow_reboot: bool = Field(
        default=False,
        description=(
            "Reboot when the loaded kernel module is not the pinned one after installing; else fail. On a "
            "Proxmox node (`lxc`, `baremetal`) the reboot passes the node's guards first, as the host's "
            "does: refused while a guest that is not pvegpu's runs (`pve_host.allow_reboot_with_foreign_"
            "guests`) or when the next boot's kernel lacks the module."
        ),
    )
    reboot_timeout_s: StrictInt = Field(
        default=600, ge=30, description="Seconds to wait for the host to come back after a reboot."
    )
    version_file: AbsolutePath = Field(
        default="/proc/driver/nvidia/version",
        description="Where the loaded kernel module reports its flavour and version (a lab path in tests).",
    )

    @field_validator("version")
    @classmethod
    def _at_least_floor(cls, version: str) -> str:
        if version_tuple(version) < DRIVER_FLOOR:
            raise ValueError(
                f"{version} is below {DRIVER_FLOOR_TEXT}, the oldest driver for the CUDA 13 runtime "
                f"of SGLang {SGLANG_VERSION}"
            )
        return version

    @field_validator("revision")
    @classmethod
    def _revision(cls, revision: str) -> str:
        if not _REVISION.fullmatch(revision):
            raise ValueError(f"{shown(revision)} is not a Debian revision like 1 or 0ubuntu1")
        return revision

    @field_validator("repository")
    @classmethod
    def _url(cls, url: str) -> str:
        if not _URL.fullmatch(url.replace("{distro}", "distro")):
            raise ValueError(f"{shown(url)} is not an http(s):// or file: URL ending in /")
        return url

    @property
    def package_version(self) -> str:
        return f"{self.version}-{self.revision}"
