#!/usr/bin/python3
"""LAB STAND-IN /sbin/mount.virtiofs (pvegpu lab): what `mount -t virtiofs TAG DIR` does in a VM guest of a
Proxmox lab node, where the guest has no virtio device. NOT a real mount helper: a real guest has none (its
kernel mounts virtiofs itself); this one exists because the lab guest's kernel has no virtiofs.

The lab hypervisor (lab/pve/hypervisor.py) makes each virtiofsN's directory of the VM's start visible in
the guest's root at `SHARES/<tag>` (the tag is the directory mapping's id, as qemu-server's
`vhost-user-fs-pci,...,tag=<dirid>`), and installs this file as /usr/sbin/mount.virtiofs (/sbin is a link to
it), which util-linux mount(8) runs for `-t virtiofs` (and a systemd .mount unit of Type=virtiofs, through
mount) with its helper convention:

    mount.virtiofs SPEC DIR [-sfnv] [-N NAMESPACE] [-o OPTIONS] [-t TYPE.SUBTYPE]

(mount passes the target canonicalized and always an `-o`: `rw` without options.) It bind-mounts
`SHARES/<SPEC>` onto DIR (`mount --bind`), then, when the options say `ro` (the last of `ro`/`rw`), remounts
the bind read-only (`mount -o remount,bind,ro`; if that fails the bind is unmounted again, as pve-container's
__bindmount_do does); `-N` is passed on to those mounts, `-f` mounts nothing, `-s`, `-n`, `-v` and every
other option are accepted and ignored. A tag the VM has no device for (no mount point at `SHARES/<tag>`) fails
as mount(8) of util-linux 2.38 reports the kernel's EINVAL (virtio_fs: `tag <T> not found`): `wrong fs type,
...` on stderr, exit status 32. `umount DIR` is a plain bind mount's (no helper needed).

Known differences: the guest's mount table shows the shared directory's own file system type, not virtiofs;
virtiofs options (`dax`, ...) change nothing.
"""

from __future__ import annotations

import getopt
import os
import subprocess
import sys
from dataclasses import dataclass

SHARES = "/var/lib/pvegpu-lab/virtiofs"  # where the lab hypervisor binds each share's directory, by tag
USAGE = "usage: mount.virtiofs spec dir [-sfnv] [-N namespace] [-o options] [-t type.subtype]"
MOUNT_FAILURE = 32  # mount(8)'s MNT_EX_FAIL
USAGE_ERROR = 1  # mount(8)'s MNT_EX_USAGE


class UsageError(Exception):
    """The command line is not the helper convention; the message says why."""


@dataclass(frozen=True)
class Request:
    """One helper call: the tag (SPEC), the mount point, the `-o` options in order, `-f`, `-N`'s value."""

    tag: str
    target: str
    options: tuple[str, ...] = ()
    fake: bool = False
    namespace: str | None = None

    @property
    def read_only(self) -> bool:
        """Whether the last of `ro`/`rw` in the options is `ro` (mount's own rule)."""
        flags = [option for option in self.options if option in ("ro", "rw")]
        return bool(flags) and flags[-1] == "ro"


def parse(argv: list[str]) -> Request:
    """The helper's arguments (without the program name) -> Request; UsageError for anything else."""
    if len(argv) < 2 or argv[0].startswith("-") or argv[1].startswith("-"):
        raise UsageError(USAGE)
    try:
        flags, rest = getopt.getopt(argv[2:], "sfnvN:o:t:")
    except getopt.GetoptError as error:
        raise UsageError(f"{error.msg}\n{USAGE}") from None
    if rest:
        raise UsageError(f"unexpected argument {rest[0]!r}\n{USAGE}")
    options: list[str] = []
    fake, namespace = False, None
    for flag, value in flags:
        if flag == "-o":
            options += [option for option in value.split(",") if option]
        elif flag == "-f":
            fake = True
        elif flag == "-N":
            namespace = value
    return Request(argv[0], argv[1], tuple(options), fake, namespace)


def wrong_fs(target: str, tag: str) -> str:
    """mount(8)'s report of EINVAL from the kernel (util-linux 2.38.1, as the lab machine's Debian 12 prints
    it), which virtio_fs gives for a tag no device has."""
    return (
        f"mount: {target}: wrong fs type, bad option, bad superblock on {tag}, missing codepage or helper "
        "program, or other error.\n"
        "       dmesg(1) may have more information after failed mount system call.\n"
    )


def share_of(request: Request, shares: str = SHARES) -> str | None:
    """The directory the lab bound for the request's tag, or None when the VM has no device of that tag."""
    if not request.tag or "/" in request.tag or request.tag.startswith("."):
        return None
    path = os.path.join(shares, request.tag)
    return path if os.path.ismount(path) else None


def commands(request: Request, share: str) -> list[list[str]]:
    """The mounts that make `share` appear at the request's target: the bind, then its read-only remount."""
    namespace = ["-N", request.namespace] if request.namespace else []
    argv = [["mount", *namespace, "--bind", share, request.target]]
    if request.read_only:
        argv.append(["mount", *namespace, "-o", "remount,bind,ro", request.target])
    return argv


def main(argv: list[str]) -> int:
    try:
        request = parse(argv)
    except UsageError as error:
        sys.stderr.write(f"mount.virtiofs: {error}\n")
        return USAGE_ERROR
    share = share_of(request)
    if share is None:
        sys.stderr.write(wrong_fs(request.target, request.tag))
        return MOUNT_FAILURE
    if request.fake:
        return 0
    bind, *remount = commands(request, share)
    done = subprocess.run(bind, check=False)
    if done.returncode != 0:
        return done.returncode
    for command in remount:
        done = subprocess.run(command, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", request.target], check=False)  # no writable bind left behind
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
