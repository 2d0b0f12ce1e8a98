"""What a Proxmox lab node's LXC container is in the lab: a lab host beside the node, shaped like one.

`up(node, vmid, dev, mode, mp)` starts lab host `<node>c<vmid>` (`container_name`) and gives it what a
container on that node sees:
- the node's PCI hardware as it is at that moment: a container sees the host's /sys, so the node's fake
  sysfs tree is copied into the container's, driver links and all (a later change on the node is not
  seen; a CT start copies again);
- the NVIDIA stand-ins' software sources (lab.guest_payload), with the container's own settings;
- for every `devN` entry of the CT config, a device node at the same path inside the container with the
  node's type and major:minor (stat of the node's node, inside the node), mode 0666 (or the entry's
  `mode`), owner `uid`:`gid` of the entry (default 0), as Proxmox creates it in the container's /dev;
- the node's NVIDIA module version file copied to the container's VERSION_FILE: a real container reads
  the host module's live /proc/driver/nvidia/version; the lab copies it at the container's start (a real
  host only changes its loaded module at a reboot, which restarts its containers);
- for every `mp` entry (`{"key": "mp0", "source", "target", "ro"}`: the CT's bind mount points, a node
  directory as `mpN`'s volume), the node's directory (the node's root + source) bind-mounted on the
  container's root + target before the container host starts, read-only for `ro`, the target's missing
  directories made, as pve-container's mountpoint_mount does (lab.pve.shares `mount_points`: its
  `directory '<source>' does not exist` and `symlink encountered at: <path>` fail the start).
The container host goes down with the node (`lab down NODE`: it is the node's dependent) and records
`{"node": ..., "vmid": ...}` in its state directory (lab.pve.node.CONTAINER_RECORD).

Not modelled: the container's own Debian root from `ostemplate` (it is the lab's base root), unprivileged
id mapping (a node's gid is shown as the entry's), `deny-write`, cgroup device rules, `netN`, an `mpN` of
a storage volume or a device, a bind mount point's `mountoptions`, `acl` and `quota`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from lab import guest_payload, hosts
from lab.errors import LabError
from lab.pve import shares
from lab.pve.node import CONTAINER_RECORD

_SSH_TIMEOUT_S = 60


class ContainerError(LabError):
    """The container lab host could not be set up; the message says why."""


def container_name(node: str, vmid: int) -> str:
    """The lab host name of CT `vmid`'s container on `node`."""
    return f"{node}c{vmid}"


def _ssh(host: hosts.LabHost, script: str) -> str:
    result = subprocess.run(
        hosts.ssh_argv(host, script), check=False, capture_output=True, text=True, timeout=_SSH_TIMEOUT_S
    )
    if result.returncode != 0:
        raise ContainerError(f"{host.name}: `{script}` failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _copy_sysfs(node: hosts.LabHost, container: hosts.LabHost) -> None:
    source = node.root / node.sysfs_root.lstrip("/")
    target = container.root / container.sysfs_root.lstrip("/")
    for child in target.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)


def _version_file(host: hosts.LabHost) -> Path:
    """The host's NVIDIA module version file, seen from the lab machine (its nvidia.env says where)."""
    env = host.root / guest_payload.SETTINGS.lstrip("/")
    lines = env.read_text().splitlines() if env.is_file() else []
    values = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return host.root / values.get("VERSION_FILE", guest_payload.VERSION_FILE).lstrip("/")


def _copy_module_version(node: hosts.LabHost, container: hosts.LabHost) -> None:
    source, target = _version_file(node), _version_file(container)
    target.unlink(missing_ok=True)
    if source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def _device_nodes(node: hosts.LabHost, container: hosts.LabHost, dev: list[dict[str, str]]) -> None:
    """Create each `devN` node in the container with the node's numbers (module docstring)."""
    if not dev:
        return
    paths = [entry["path"] for entry in dev]
    found = _ssh(node, "stat -c '%F %t %T' -- " + " ".join(map(shlex.quote, paths))).splitlines()
    script = []
    for entry, line in zip(dev, found, strict=True):
        kind, major, minor = line.rsplit(" ", 2)
        letter = {"character special file": "c", "block special file": "b"}.get(kind)
        if letter is None:
            raise ContainerError(f"{entry['path']} is not a device on {node.name}")
        path = shlex.quote(entry["path"])
        mode = entry.get("mode", "0666")
        owner = f"{int(entry.get('uid', '0'))}:{int(entry.get('gid', '0'))}"
        script.append(
            f'mkdir -p "$(dirname {path})" && rm -f {path} && '
            f"mknod -m {mode} {path} {letter} {int(major, 16)} {int(minor, 16)} && chown {owner} {path}"
        )
    _ssh(container, " && ".join(script))


def up(
    node_name: str,
    vmid: int,
    dev: list[dict[str, str]],
    mode: hosts.Mode,
    mp: list[dict[str, Any]] | None = None,
) -> hosts.LabHost:
    """Start CT `vmid`'s container host on `node_name` (module docstring); raises ContainerError,
    ShareError, LabError or PayloadError after stopping what it started."""
    node = hosts.get_host(node_name)
    name = container_name(node_name, vmid)
    hosts.add_dependent(node_name, name)  # before up: a `lab down NODE` meanwhile still finds it
    try:
        container = hosts.up(
            name,
            node.topology,
            mode,
            replace=True,
            customize=lambda root: shares.mount_points(node.root, root, vmid, mp or []),
        )
        _copy_sysfs(node, container)
        guest_payload.install(container)
        _copy_module_version(node, container)
        _device_nodes(node, container, dev)
    except BaseException:
        down(node_name, vmid)
        raise
    record = {"node": node_name, "vmid": vmid}
    (container.state_dir / CONTAINER_RECORD).write_text(json.dumps(record, sort_keys=True) + "\n")
    return container


def down(node_name: str, vmid: int) -> None:
    name = container_name(node_name, vmid)
    hosts.down(name)
    hosts.remove_dependent(node_name, name)


def run(node_name: str, vmid: int, argv: list[str], timeout_s: float) -> dict[str, Any]:
    """Run `argv` in the container as root (like lxc-attach: no shell in between); the hypervisor's answer
    `{"ok": true, "status": N, "stdout": ..., "stderr": ...}`."""
    container = hosts.get_host(container_name(node_name, vmid))
    result = subprocess.run(
        hosts.ssh_argv(container, shlex.join(argv)),
        check=False,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout_s,
    )
    return {"ok": True, "status": result.returncode, "stdout": result.stdout, "stderr": result.stderr}
