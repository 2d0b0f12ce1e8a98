"""The Q35 VM that gets the GPUs: host data key `vm`.

    ("pve1", {"node": {...}, "vm": {"vmid": 120, "name": "llm", "cores": 32, "memory": 262144}})

Formats are Proxmox's (shared/knowledge/proxmox-hostpci-vm-config.md §3, proxmox-api-behaviour.md §4.2):
vmid `^[1-9][0-9]{2,8}$` (100-999999999), `machine` q35 or a pinned `pc-q35-X.Y[+pveN]`, `memory` ≥ 16 MiB,
`hugepages` `2|1024|any` and only with `numa` (Proxmox: `numa needs to be enabled to use hugepages`);
`numa_layout` and `host_reserved_cores` shape the guest's NUMA nodes (pvegpu/plan/numa.py).
What pvegpu always sets and does not ask for: `bios: ovmf`, `efidisk0`, `cpu: host`, `balloon: 0`,
`agent: 1`, and `hostpciN: mapping=<prefix>N,pcie=1` per GPU.

With `image` the system disk is made from a cloud image (`import-from`) and cloud-init gives the guest
`user`, `ssh_public_keys`, `ipconfig` and an SSH host key pvegpu generated (pvegpu/plan/cloud_init.py).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    model_validator,
)

from pvegpu.models.fields import matching
from pvegpu.models.ipconfig import check_ipconfig
from pvegpu.models.openssh import check_public_key

VM_KEY = "vm"

_MACHINE = re.compile(r"q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?")
# PVE's `dns-name` format (the VM `name`), and `pve-storage-id`.
_DNS_NAME = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
)
_STORAGE_ID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]")
_BRIDGE = re.compile(r"[a-zA-Z][a-zA-Z0-9_.-]{0,14}")
_MAPPING_PREFIX = re.compile(r"[a-z][a-z0-9_-]*", re.IGNORECASE)
# A disk image Proxmox's `import` content holds (pve-storage: SAFE_CHAR_CLASS_RE, UPLOAD_IMPORT_EXT_RE_1 less
# `.ova`, which is an appliance, not a disk).
_IMPORT_FILE = re.compile(r"[a-zA-Z0-9\-.+=_]+\.(qcow2|raw|vmdk)")
_IMAGE_VOLUME = re.compile(rf"{_STORAGE_ID.pattern}:import/{_IMPORT_FILE.pattern}")
_URL = re.compile(r"https?://[^\s/?#]+/[^\s?#]+(\?[^\s#]*)?")
# Hex digits per digest pvegpu accepts: Proxmox's download-url `checksum-algorithm` values of SHA-256 or
# stronger (it takes md5, sha1 and sha224 too, which a forged image can match).
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
_WEAK_DIGESTS = ("md5", "sha1", "sha224")
_HEX = re.compile(r"[0-9a-fA-F]+")
# A login name cloud-init creates (Debian's NAME_REGEX, 32 characters at most as useradd allows).
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


class DiskSpec(BaseModel):
    """The VM's system disk (`scsi0`), allocated on create."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    storage: Annotated[str, matching(_STORAGE_ID, "a Proxmox storage id (e.g. local-lvm)")] = Field(
        default="local-lvm",
        description=(
            "Proxmox storage for the system disk and the EFI vars disk (`pve-storage-id`, e.g. `local-lvm`)."
        ),
    )
    size_gib: StrictInt = Field(
        default=200, ge=1, description="System disk size in GiB, allocated on create."
    )


class NetSpec(BaseModel):
    """The VM's network device (`net0`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    model: Literal["virtio", "e1000", "vmxnet3"] = Field(default="virtio", description="NIC model of `net0`.")
    bridge: Annotated[str, matching(_BRIDGE, "a Linux bridge name (e.g. vmbr0)")] = Field(
        default="vmbr0", description="Host bridge `net0` is attached to (e.g. `vmbr0`)."
    )


class ImageVolume(BaseModel):
    """A cloud image already on the node: `vm.image = {"volume": "local:import/<file>.qcow2"}`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    volume: Annotated[
        str,
        matching(_IMAGE_VOLUME, "a disk image volume like local:import/<file>.qcow2 (.qcow2, .raw or .vmdk)"),
    ] = Field(
        description=(
            "Proxmox volume (content `import`) the system disk is imported from: `<storage>:import/<file>` "
            "with .qcow2, .raw or .vmdk."
        )
    )


ImageDigest = Literal["sha256", "sha384", "sha512"]


def _strong_digest(value: object) -> object:
    if value in _WEAK_DIGESTS:
        raise ValueError(f"{value} is too weak to trust an image by: use sha256, sha384 or sha512")
    return value


class ImageUrl(BaseModel):
    """A cloud image the node downloads (kept: a later run downloads nothing): `vm.image = {"url": ...}`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    url: Annotated[str, matching(_URL, "an http(s) URL of an image file")] = Field(
        description=(
            "http(s) URL of the cloud image, downloaded by the node through the API (`download-url`); "
            "`checksum` is always required, so an http download is checked too."
        )
    )
    checksum: Annotated[str, matching(_HEX, "a hex digest"), AfterValidator(str.lower)] = Field(
        description=(
            "The image's published digest (hex, stored lowercase); a download that does not match stops "
            "before the VM is created, and an image volume already on the node is used only when its "
            "digest (hashed on the node) is this one."
        )
    )
    checksum_algorithm: Annotated[ImageDigest, BeforeValidator(_strong_digest)] = Field(
        default="sha512",
        description=(
            "Digest algorithm of `checksum`: sha256, sha384 or sha512 (Debian publishes SHA512SUMS); "
            "md5, sha1 and sha224 are refused."
        ),
    )
    storage: Annotated[str, matching(_STORAGE_ID, "a Proxmox storage id (e.g. local)")] = Field(
        default="local",
        description="Storage the image is downloaded to (`<storage>:import/<file name>`, content `import`).",
    )
    file_name: (
        Annotated[str, matching(_IMPORT_FILE, "a file name ending in .qcow2, .raw or .vmdk")] | None
    ) = Field(
        default=None,
        description=(
            "Name of the downloaded file; None: the URL's last path part. Proxmox's `import` content "
            "takes only .qcow2, .raw and .vmdk: name Ubuntu's `.img` (a qcow2) `<name>.qcow2`. Proxmox "
            "stores it with each character other than a-z, A-Z, 0-9, `_`, `.` and `-` made `_`, and the "
            "volume pvegpu imports from is named the same way."
        ),
    )

    @model_validator(mode="after")
    def _fits(self) -> ImageUrl:
        digits = _DIGEST_HEX[self.checksum_algorithm]
        if len(self.checksum) != digits:
            raise ValueError(
                f"checksum has {len(self.checksum)} hex digits; "
                f"a {self.checksum_algorithm} digest has {digits}"
            )
        if self.file_name is None and not _IMPORT_FILE.fullmatch(self.stored_name):
            raise ValueError(
                f"the URL's file name {url_file_name(self.url)!r} does not end in .qcow2, .raw or .vmdk "
                "(Proxmox's import content): set file_name (Ubuntu's .img cloud images are qcow2)"
            )
        return self

    @property
    def stored_name(self) -> str:
        """The file name the image has in `<storage>:import/`: `file_name` or the URL's, as Proxmox stores
        it (`normalized_file_name`)."""
        return normalized_file_name(self.file_name or url_file_name(self.url))


def url_file_name(url: str) -> str:
    """The last part of `url`'s path (`.../debian-12-genericcloud-amd64.qcow2` -> that name)."""
    return PurePosixPath(urlsplit(url).path).name


_NOT_KEPT = re.compile(r"[^a-zA-Z0-9_.-]")


def normalized_file_name(name: str) -> str:
    """The name `download-url` stores a file under (pve-storage src/PVE/Storage.pm
    `normalize_content_filename`, called by API2/Storage/Status.pm `download_url`): one trailing newline
    dropped, everything up to the last `/` or `\\` dropped, every other character than a-z A-Z 0-9 `_` `.`
    `-` made `_` (`debian+12=x.qcow2` -> `debian_12_x.qcow2`)."""
    return _NOT_KEPT.sub("_", re.sub(r"^.*[/\\]", "", name.removesuffix("\n")))


def _image_kind(value: Any) -> str | None:
    """Which image form a mapping is: `url` when it has one, else `volume` when it has one."""
    if isinstance(value, ImageUrl | ImageVolume):
        return "url" if isinstance(value, ImageUrl) else "volume"
    if isinstance(value, dict):
        return "url" if "url" in value else "volume" if "volume" in value else None
    return None


Image = Annotated[
    Annotated[ImageVolume, Tag("volume")] | Annotated[ImageUrl, Tag("url")],
    Discriminator(
        _image_kind,
        custom_error_type="image_form",
        custom_error_message=(
            "must be a mapping with `volume` (an image on the node) or `url` and `checksum` (downloaded)"
        ),
    ),
]


def _check_keys(keys: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(keys)) != len(keys):
        raise ValueError("lists a key twice")
    return keys


class VmSpec(BaseModel):
    """The Q35/OVMF VM the GPUs are passed to: host data key `vm`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    vmid: StrictInt = Field(
        ge=100,
        le=999_999_999,
        description="Proxmox VM id (100-999999999). pvegpu never recreates a VM with disks.",
    )
    name: Annotated[str, matching(_DNS_NAME, "a DNS name (letters, digits, hyphens, dots)")] = Field(
        default="llm", description="VM name (Proxmox `dns-name` format: letters, digits, hyphens, dots)."
    )
    machine: Annotated[str, matching(_MACHINE, "q35 or a pinned pc-q35-X.Y[+pveN] machine")] = Field(
        default="q35",
        description=(
            "Machine type: `q35` (latest) or a pinned version such as `pc-q35-9.2+pve1`; "
            "`pcie=1` passthrough needs q35."
        ),
    )
    cores: StrictInt = Field(
        default=16,
        ge=1,
        le=8192,
        description=(
            "vCPUs in all (`cpu: host`): one socket, or with `numa_layout: host` one socket per guest NUMA "
            "node, split evenly."
        ),
    )
    memory: StrictInt = Field(
        default=65536, ge=16, description="RAM in MiB (all of it is pinned for DMA with passthrough)."
    )
    numa: StrictBool = Field(
        default=True, description="Expose NUMA to the guest (Proxmox `numa: 1`); needed for hugepages."
    )
    hugepages: Literal["2", "1024", "any"] | None = Field(
        default=None,
        description="Back RAM with hugepages of this size in MiB (`2`, `1024` or `any`); None: off.",
    )
    numa_layout: Literal["host", "flat"] | None = Field(
        default=None,
        description=(
            "Guest NUMA layout (experimental until measured on real hardware): `host` gives the guest one "
            "NUMA node per host node holding the VM's GPUs (`numaN` bound to it, `sockets` = those nodes, "
            "`cores` split evenly, `affinity` on their CPUs but `host_reserved_cores`); `flat` one socket, "
            "no `numaN`, no `affinity`; None: `host` when the host has 2+ NUMA nodes and every GPU of the "
            "VM knows its node, else `flat` (pvegpu/plan/numa.py)."
        ),
    )
    host_reserved_cores: tuple[Annotated[int, Field(ge=0)], ...] | None = Field(
        default=None,
        description=(
            "Host CPU ids (as Linux numbers them) the VM's `affinity` leaves to the host with "
            "`numa_layout: host`; None: the first CPU of each NUMA node the VM uses (where the host's "
            "housekeeping, timers and many IRQs run; its SMT sibling stays usable)."
        ),
    )
    disk: DiskSpec = Field(default_factory=DiskSpec, description="System disk.")
    net: NetSpec = Field(default_factory=NetSpec, description="Network device.")
    onboot: StrictBool = Field(default=True, description="Start the VM when the node boots (`onboot`).")
    adopt: StrictBool = Field(
        default=False,
        description=(
            "Take over a VM at `vmid` that lacks pvegpu's mark (the `pvegpu` tag and the line "
            "`pvegpu-owner: <pve.owner>` in its description), e.g. your own VM to convert to Q35: the run "
            "writes the mark, later runs need no switch. Without it such a VM is refused, left as it is."
        ),
    )
    mapping_prefix: Annotated[
        str, matching(_MAPPING_PREFIX, "a mapping id prefix (a letter, then a-z 0-9 _ -)")
    ] = Field(
        default="gpu",
        description=(
            "PCI mapping ids are `<prefix>0`, `<prefix>1`, ...; ids outside this scheme are never touched."
        ),
    )
    mmio: Literal["args", "phys-bits"] = Field(
        default="args",
        description=(
            "How the 64-bit MMIO window for the GPUs' BARs is set: `args` (OVMF X-PciMmio64Mb sized from "
            "the BARs, up to 16 TiB; root@pam only) or `phys-bits` (the `cpu` key, which API tokens may "
            "set: `host,guest-phys-bits=N` on qemu-server 9.0.18+, OVMF's window being 2^(N-3) bytes; "
            "before that `host`, the window 2^(min(host bits, 46)-3): QEMU ignores `phys-bits` with the "
            "`host` CPU). A plan whose window cannot hold the BARs is refused (pvegpu/plan/mmio.py)."
        ),
    )

    p2p: Literal["off", "probe", "on"] = Field(
        default="off",
        description=(
            "GPU peer-to-peer inside the VM (experimental until measured on real hardware; "
            "pvegpu/plan/p2p.py): `off` the SHM plan; `probe` sets the GPUs' `x-nv-gpudirect-clique`, "
            "restarts the VM and runs a probe in the guest's SGLang venv, keeping P2P only when every pair, "
            "checksum and all-reduce check passes and P2P beats SHM (else the clique is removed again); "
            "`on` the clique without a probe (every run warns)."
        ),
    )
    p2p_probe_timeout_s: StrictInt = Field(
        default=600,
        ge=10,
        description=(
            "Time bound of the P2P probe in the guest (`vm.p2p: probe`): a probe still running then is "
            "killed and counts as a hang."
        ),
    )
    image: Image | None = Field(
        default=None,
        description=(
            "Cloud image the system disk is made from on create (`import-from`, then grown to "
            "`disk.size_gib`): `{volume: <storage>:import/<file>}` or `{url, checksum, checksum_algorithm, "
            "storage, file_name}`; None: an empty disk (install an OS yourself)."
        ),
    )
    user: Annotated[str, matching(_USER, "a login name (a-z, 0-9, _ and -, at most 32)")] = Field(
        default="root",
        description=(
            "Guest user cloud-init sets up (another than root gets passwordless sudo); the user pyinfra "
            "logs in as (with `image`), with the login key pvegpu generated for this guest."
        ),
    )
    ssh_public_keys: Annotated[
        tuple[Annotated[str, AfterValidator(check_public_key)], ...], AfterValidator(_check_keys)
    ] = Field(
        default=(),
        description=(
            "More OpenSSH public keys for `user` in the guest (yours), besides the login key pvegpu "
            "generates for pyinfra (README, Security)."
        ),
    )
    ipconfig: Annotated[str, AfterValidator(check_ipconfig)] = Field(
        default="ip=dhcp",
        description=(
            "Guest network (Proxmox `ipconfig0`): `ip=dhcp` or `ip=<IPv4>/<prefix>,gw=<IPv4>`, and/or "
            "`ip6=dhcp|auto|<IPv6>/<prefix>,gw6=<IPv6>`. With DHCP pvegpu learns the address from the "
            "guest agent."
        ),
    )
    snippets_storage: Annotated[str, matching(_STORAGE_ID, "a Proxmox storage id (e.g. local)")] = Field(
        default="local",
        description=(
            "Directory storage holding the cloud-init user-data snippet and pvegpu's hookscript (pvegpu "
            "adds the `snippets` content type, keeping the others)."
        ),
    )
    self_heal: Literal["repair", "check", "off"] = Field(
        default="repair",
        description=(
            "What the node does at every VM start (pvegpu's pre-start hookscript, on `snippets_storage`): "
            "`repair` renumber-only drift of the GPU mappings after a BIOS change and refuse real hardware "
            "changes with the fix command; `check` refuse both, writing nothing; `off` no hook."
        ),
    )

    @model_validator(mode="after")
    def _hugepages_need_numa(self) -> VmSpec:
        if self.hugepages is not None and not self.numa:
            raise ValueError("hugepages need numa: true (Proxmox: numa needs to be enabled to use hugepages)")
        if self.numa_layout == "host" and not self.numa:
            raise ValueError("numa_layout: host needs numa: true (the guest's NUMA nodes are numaN keys)")
        return self
