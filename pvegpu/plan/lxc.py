"""The NVIDIA device plumbing of an LXC container on the host driver, and the driver version check. Pure.

The container uses the host's kernel module, so it needs the host's device nodes: one `/dev/nvidiaN` per
GPU, `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`, and the `nvidia-caps` nodes.

- Proxmox VE >= 8.1: native `devN:` entries (API fields `path`, `gid`, ...), one per device node, no raw
  LXC lines: `dev0: /dev/nvidia0,gid=44`. gid 44 is `video` in Debian-based containers.
- Older: raw `lxc.cgroup2.devices.allow` lines by character major (195 for the nvidia nodes; `nvidia-uvm`
  and `nvidia-caps` are dynamic, read from the host's /proc/devices) and one `lxc.mount.entry` bind per
  node (the directory `/dev/nvidia-caps` as a whole), as community-scripts' nvidia.func writes them.

Formats: shared/knowledge/sglang-nccl-drivers-lxc-bios.md §4.3. Every raw line is checked before it is
written (`raw_line_problem`): a key as pve-container parses one, a value of printable characters.

The node's model store (`model` data, pvegpu/models/model.py) is bind-mounted read-only at the same path:
`mp0: <path>,mp=<path>,ro=1` (`store_mount`, pve-container's own form of it). An `mpN` that already holds
that line is kept; when `mp0` holds anything else (the operator's) the first free `mpN` gets it, and no other
`mpN` is touched. A bind mount is root@pam's only (pve-container LXC.pm check_ct_modify_config_perm): an API
token's write of it goes through root's pvesh (pvegpu/models/pve_root_only.py). pve-container hotplugs a new
`mpN` into a running container; a changed one stays pending until the container's next start.

`plan_container` gathers it for the container role (pvegpu/run/container.py reads what it is planned from).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.fields import shown
from pvegpu.models.lxc import LxcSpec
from pvegpu.models.nvidia import CAPS_DIR
from pvegpu.plan.errors import PlanError

NATIVE_DEV_SINCE = (8, 1)
NVIDIA_MAJOR = 195
VIDEO_GID = 44
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
UVM = "nvidia-uvm"
CAPS = "nvidia-caps"
# pve-container's parse_pct_config reads `(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$`: a value with a
# control character, or leading or trailing blanks, would not read back as written (or ends the line).
RAW_KEY = re.compile(r"lxc\.[a-z0-9_.-]+")
MP_KEY = re.compile(r"mp([0-9]{1,3})")
MAX_MOUNT_POINTS = 256  # pve-container LXC/Config.pm $MAX_MOUNT_POINTS: mp0..mp255
_CAP_NODE = re.compile(rf"{re.escape(CAPS_DIR)}/[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class LxcDevices:
    """`dev`: devN key -> value (>= 8.1); `raw`: (key, value) raw LXC lines in order (older)."""

    dev: dict[str, str]
    raw: tuple[tuple[str, str], ...]


def device_nodes(gpus: int, caps: Sequence[str]) -> tuple[str, ...]:
    """Every device node the container needs: `/dev/nvidia0..N-1`, the control nodes, `caps` (sorted)."""
    return (*(f"/dev/nvidia{n}" for n in range(gpus)), *CONTROL_NODES, *sorted(caps))


def plan_lxc_devices(
    gpus: int,
    pve_version: tuple[int, int],
    caps: Sequence[str],
    majors: Mapping[str, int],
    gid: int = VIDEO_GID,
) -> LxcDevices:
    """The container's device entries for `gpus` GPUs on Proxmox `pve_version` (major, minor).

    `caps`: the host's `/dev/nvidia-caps/*` nodes; `majors`: character device name -> major from the host's
    /proc/devices (only used before 8.1). Raises PlanError when an older Proxmox's /proc/devices lacks
    `nvidia-uvm` (the driver's uvm module is not loaded: the raw lines cannot be written) or lacks
    `nvidia-caps` while caps exist.
    """
    odd = [cap for cap in caps if not _CAP_NODE.fullmatch(cap)]
    if odd:
        raise PlanError(
            f"host: {shown(odd[0])} is not a device node like {CAPS_DIR}/nvidia-capN: "
            "not writing it into the container's config"
        )
    if pve_version >= NATIVE_DEV_SINCE:
        nodes = device_nodes(gpus, caps)
        return LxcDevices(dev={f"dev{n}": f"{path},gid={gid}" for n, path in enumerate(nodes)}, raw=())
    missing = [name for name in (UVM, *((CAPS,) if caps else ())) if name not in majors]
    if missing:
        raise PlanError(
            f"host: /proc/devices has no {' / '.join(missing)} major (nvidia_uvm not loaded?): "
            f"cannot write the lxc.cgroup2 lines Proxmox {pve_version[0]}.{pve_version[1]} needs"
        )
    allow = [NVIDIA_MAJOR, majors[UVM], *((majors[CAPS],) if caps else ())]
    raw = [("lxc.cgroup2.devices.allow", f"c {major}:* rwm") for major in allow]
    raw += [
        ("lxc.mount.entry", f"{path} {path.lstrip('/')} none bind,optional,create=file")
        for path in device_nodes(gpus, ())
    ]
    if caps:
        raw.append(("lxc.mount.entry", f"{CAPS_DIR} {CAPS_DIR.lstrip('/')} none bind,optional,create=dir"))
    return LxcDevices(dev={}, raw=tuple(raw))


@dataclass(frozen=True)
class ContainerPlan:
    """The `lxc` profile's container as pvegpu wants it: the keys it converges (`config`) and gives only on
    create (`create`), its raw `lxc.*` lines (`raw`), and the version of the host's loaded NVIDIA module
    (`host_module`, None: none loaded) its userspace driver must equal. `waiting`: why its devices cannot be
    planned yet (then nothing else is planned). `store`: the node's model store, bind-mounted read-only at
    its own path (None: no `model` data)."""

    spec: LxcSpec
    config: Mapping[str, str]
    create: Mapping[str, str]
    raw: tuple[tuple[str, str], ...]
    host_module: str | None
    waiting: str | None = None
    store: str | None = None

    @property
    def created_with(self) -> dict[str, str]:
        """The keys a create of the container sends (`POST /nodes/{node}/lxc`): `config` and `create`, and
        `mp0` with the model store."""
        store = {} if self.store is None else {"mp0": store_mount(self.store)}
        return {**self.config, **self.create, **store}


def plan_container(
    spec: LxcSpec,
    gpus: int,
    pve_version: tuple[int, int],
    caps: Sequence[str],
    majors: Mapping[str, int],
    *,
    host_module: str | None,
    store: str | None = None,
) -> ContainerPlan:
    """The plan of container `spec` with `gpus` GPUs on Proxmox `pve_version`, from the host's device nodes
    (`caps`, `majors`: `plan_lxc_devices`) and loaded module `host_module`; `store`: the node's model store
    (`ModelSpec.path`; None: none). PlanError when the devices cannot
    be planned while the module is loaded, or for a raw line `raw_line_problem` refuses; without the module
    that is `waiting`: before 8.1 the raw lines need the uvm major, known once the driver this run installs
    loads."""
    try:
        devices = plan_lxc_devices(gpus, pve_version, caps, majors, spec.video_gid)
    except PlanError as error:
        if host_module is not None:
            raise
        waiting = f"container not converged yet: {error}; run again"
        return ContainerPlan(spec, {}, {}, (), host_module, waiting)
    config, create = container_config(spec, devices), create_keys(spec)
    return ContainerPlan(spec, config, create, raw_lines(spec, devices), host_module, store=store)


def store_mount(path: str) -> str:
    """The model store's bind mount: `<path>,mp=<path>,ro=1` (read-only, the same path inside; the form
    pve-container prints a mount point in: the volume, then its options sorted)."""
    return f"{path},mp={path},ro=1"


def store_key(path: str, current: Mapping[str, object]) -> tuple[str, bool] | None:
    """Which `mpN` of `current` holds the model store at `path`, and whether it must be set there: the one
    that holds `store_mount(path)` already (False), else `mp0` or, when that is taken, the first free `mpN`
    (True); None when all 256 are taken."""
    line = store_mount(path)
    held = sorted((key for key in current if MP_KEY.fullmatch(key)), key=lambda key: int(key[2:]))
    for key in held:
        if str(current[key]) == line:
            return key, False
    free = next((f"mp{n}" for n in range(MAX_MOUNT_POINTS) if f"mp{n}" not in current), None)
    return None if free is None else (free, True)


def version_drift(host_module: str | None, container_userspace: str | None) -> str | None:
    """None when the container's userspace driver equals the host's kernel module; else the problem,
    naming both versions (a mismatch makes NVML fail with `Driver/library version mismatch`)."""
    if host_module is None:
        return "the host has no NVIDIA kernel module loaded: the container's driver has nothing to match"
    if container_userspace is None:
        return f"the container has no NVIDIA userspace driver; the host module is {host_module}"
    if host_module != container_userspace:
        return (
            f"driver version mismatch: host kernel module {host_module}, container userspace "
            f"{container_userspace} (NVML fails with 'Driver/library version mismatch'; install the "
            f"container's userspace at {host_module}, without a kernel module)"
        )
    return None


SHM_ENTRY = "lxc.mount.entry"
SHM_PREFIX = "tmpfs dev/shm tmpfs "


def shm_line(gib: int) -> tuple[str, str]:
    """The raw line giving the container a `gib` GiB /dev/shm (a tmpfs of its own, as Docker's --shm-size)."""
    return (SHM_ENTRY, f"{SHM_PREFIX}size={gib}G,nosuid,nodev,create=dir 0 0")


def container_config(spec: LxcSpec, devices: LxcDevices) -> dict[str, str]:
    """The API keys pvegpu converges on the container: size, boot, and every `devN` entry."""
    return {
        "hostname": spec.hostname,
        "cores": str(spec.cores),
        "memory": str(spec.memory),
        "swap": str(spec.swap),
        "onboot": "1" if spec.onboot else "0",
        **devices.dev,
    }


def create_keys(spec: LxcSpec) -> dict[str, str]:
    """Keys given only on create: Proxmox cannot change them later (rootfs size aside)."""
    return {
        "ostemplate": spec.ostemplate,
        "rootfs": f"{spec.storage}:{spec.rootfs_gib}",
        "unprivileged": "1" if spec.unprivileged else "0",
        "net0": f"name=eth0,bridge={spec.bridge},ip=dhcp",
        **({"ssh-public-keys": "\n".join(spec.ssh_public_keys) + "\n"} if spec.ssh_public_keys else {}),
    }


def raw_lines(spec: LxcSpec, devices: LxcDevices) -> tuple[tuple[str, str], ...]:
    """The raw `lxc.*` lines the container's config file must hold: the device lines (Proxmox < 8.1), then
    the /dev/shm mount. PlanError for a line `raw_line_problem` refuses."""
    lines = (*devices.raw, shm_line(spec.shm_gib))
    for key, value in lines:
        problem = raw_line_problem(key, value)
        if problem is not None:
            raise PlanError(problem)
    return lines


def raw_line_problem(key: str, value: str) -> str | None:
    """None when `key: value` reads back as written from a container's config (RAW_KEY's comment), else why
    not: a key unlike `lxc.<name>`, an empty value, a control character (a newline would start a line of
    its own), or blanks around the value."""
    if not RAW_KEY.fullmatch(key):
        return f"raw lxc line: key {shown(key)} is not like lxc.<name> (a-z, 0-9, _ . -)"
    if not value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return f"raw lxc line {key}: value {shown(value)} is empty or has a control character"
    if value != value.strip(" \t"):
        return f"raw lxc line {key}: value {shown(value)} starts or ends with a blank"
    return None


@dataclass(frozen=True)
class ContainerChange:
    """Keys to set and `devN` keys to delete (pvegpu owns every `devN` of its container)."""

    set: dict[str, str]
    delete: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete)


def diff_container(
    config: Mapping[str, str], current: Mapping[str, object], store: str | None = None
) -> ContainerChange:
    """What to PUT so that `current` (the API's GET, values as Proxmox types them) has `config`, and the model
    store at `store` (None: none) bind-mounted (`store_key`: the operator's `mpN` never touched).
    PlanError when every `mpN` is taken."""
    changes = {key: value for key, value in config.items() if str(current.get(key)) != value}
    if store is not None:
        slot = store_key(store, current)
        if slot is None:
            raise PlanError(f"every mpN is taken: the model store {store} cannot be mounted")
        if slot[1]:
            changes[slot[0]] = store_mount(store)
    stale = tuple(
        sorted(
            (key for key in current if re.fullmatch(r"dev[0-9]{1,9}", key) and key not in config),
            key=lambda key: int(key[3:]),
        )
    )
    return ContainerChange(set=changes, delete=stale)


def raw_of(values: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """The raw lines of an API config read: its `lxc` key, `[["lxc.cgroup2.devices.allow", "c 195:* rwm"]]`
    as pairs."""
    raw = values.get("lxc")
    if not isinstance(raw, list):
        return ()
    return tuple((str(pair[0]), str(pair[1])) for pair in raw if isinstance(pair, list) and len(pair) == 2)
