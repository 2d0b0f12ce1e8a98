"""The node's directories a Proxmox lab node's guests see, bind-mounted into a guest's root before the guest
host starts (lab.hosts `up(..., customize=...)`; `down` unmounts everything under a host's state directory):

- a VM's virtiofsN (`virtiofs_binds`): the directory mapping's directory on the node (the node's root + path,
  symlinks followed as the node follows them, as virtiofsd opens it) at `SHARES/<dirid>` in the guest, which
  the guest mounts with `mount -t virtiofs <dirid> DIR` through the LAB STAND-IN /sbin/mount.virtiofs
  (lab/standins/mount_virtiofs.py, `install_helper`): qemu-server's `vhost-user-fs-pci,...,tag=<dirid>`;
- a CT's bind mount point mpN (`mount_points`): the node's directory on the container's root + `mp`, read-only
  for `ro=1`, as pve-container's mountpoint_mount does at the start (src/PVE/LXC.pm): the target path is
  walked without following a symlink, its missing directories made (0755), then `directory '<source>' does
  not exist` for a source that is none, `symlink encountered at: <path>` for a source or target path through
  a symlink (the target's path shown under the CT's real root, /var/lib/lxc/<vmid>/rootfs), then
  `mount --bind` and, for ro, `mount -o bind,remount,ro` (the bind undone if that fails).

A guest sees only what is on the node's own root file system (not a file system the node mounted inside its
namespace, e.g. its /tmp or /run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.standins import mount_virtiofs

SHARES = mount_virtiofs.SHARES  # in a VM guest's root: one directory per virtiofs tag
HELPER = "/usr/sbin/mount.virtiofs"  # /sbin is a link to /usr/sbin in the lab's Debian root
_HELPER_SOURCE = Path(mount_virtiofs.__file__)
_MAX_LINKS = 40  # the kernel's MAXSYMLINKS


class ShareError(LabError):
    """A guest's shared directory could not be set up; the message says why (Proxmox's text where it has
    one)."""


@dataclass(frozen=True)
class Bind:
    """One virtiofs share's bind: `source` on this machine, `target` the path in the guest's root (writable:
    the guest's own mount decides ro)."""

    source: Path
    target: str


def on_host(root: Path, path: str) -> Path:
    """`path` of the host whose "/" is `root`, on this machine: symlinks followed as that host follows them
    (an absolute link is the host's, not this machine's); ShareError past 40 links."""
    pending = [part for part in path.split("/") if part]
    done: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = done[:-1]
            continue
        candidate = root.joinpath(*done, part)
        if not candidate.is_symlink():
            done.append(part)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise ShareError(f"{path}: Too many levels of symbolic links")
        link = os.readlink(candidate)
        done = [] if link.startswith("/") else done
        pending = [p for p in link.split("/") if p] + pending
    return root.joinpath(*done)


def virtiofs_binds(node_root: Path, virtiofs: list[dict[str, Any]]) -> list[Bind]:
    """A VM start's `virtiofs` entries (`{"index", "dirid", "path"}`, lab/pve/hypervisor.py) -> the binds
    into the guest's root, in index order: the node's directory at `SHARES/<dirid>`."""
    entries = sorted(virtiofs, key=lambda entry: int(entry["index"]))
    return [Bind(on_host(node_root, str(e["path"])), f"{SHARES}/{e['dirid']}") for e in entries]


def _walk(root: Path, path: str, shown: str, mkdir: bool) -> Path:
    """pve-container's walk_tree_nofollow: `path` under `root` without following a symlink (`shown` is the
    start as the messages name it), making missing directories when `mkdir`."""
    current = root
    for part in [p for p in path.split("/") if p]:
        shown += f"/{part}"
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            raise ShareError(f"symlink encountered at: {shown}")
        if not current.exists():
            if not mkdir:
                raise ShareError(f"cannot open directory {shown}: No such file or directory")
            current.mkdir(mode=0o755)
    return current


def _run(*argv: str | Path) -> None:
    command = [str(a) for a in argv]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise ShareError(f"command '{' '.join(command)}' failed: exit code {result.returncode}")


def bind(source: Path, target: Path, read_only: bool) -> None:
    """pve-container's __bindmount_do: bind, then a read-only remount (undoing the bind if that fails)."""
    _run("mount", "-o", "bind", source, target)
    if read_only:
        try:
            _run("mount", "-o", "bind,remount,ro", target)
        except ShareError:
            _run("umount", target)
            raise


def bind_virtiofs(root: Path, binds: list[Bind]) -> None:
    """Bind each share into a VM guest's `root` (`virtiofs_binds`) and install the mount helper."""
    for share in binds:
        if not share.source.is_dir():
            raise ShareError(f"virtiofs: shared directory {share.source} is not a directory on the node")
        target = root / share.target.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        bind(share.source, target, read_only=False)
    install_helper(root)


def install_helper(root: Path) -> None:
    """The LAB STAND-IN mount.virtiofs (lab/standins/mount_virtiofs.py) in a VM guest's `root`."""
    helper = root / HELPER.lstrip("/")
    shutil.copyfile(_HELPER_SOURCE, helper)
    helper.chmod(0o755)


def mount_points(node_root: Path, root: Path, vmid: int, mp: list[dict[str, Any]]) -> None:
    """Bind each `mp` entry (`{"key", "source", "target", "ro"}`, lab/pve/hypervisor.py) of CT `vmid` from
    the node's root into the container's `root` (module docstring)."""
    for entry in mp:
        source, target = str(entry["source"]), str(entry["target"])
        mount_path = _walk(root, target, f"/var/lib/lxc/{vmid}/rootfs", mkdir=True)
        if not on_host(node_root, source).is_dir():
            raise ShareError(f"directory '{source}' does not exist")
        found = _walk(node_root, source, "/", mkdir=False)
        bind(found, mount_path, bool(entry.get("ro")))
