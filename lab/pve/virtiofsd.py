"""The virtiofsd a lab VM start's QEMU check connects to (lab/pve/qemu_check.py): qemu-server's command line
for it, run with the virtiofsd the lab machine has. LAB STAND-IN for the daemon qemu-server starts for each
virtiofsN; this is NOT Proxmox.

qemu-server 9.2 (src/PVE/QemuServer/Virtiofs.pm start_virtiofsd) listens on
/run/qemu-server/virtiofsd/vm<vmid>-fs<N> itself, starts `/usr/libexec/virtiofsd` (Debian's Rust virtiofsd,
package virtiofsd) detached with that socket's descriptor (`--fd=<fd>`), and keeps its own copy of the socket
until QEMU runs, so that QEMU waits for the daemon. The lab machine is Debian 12, whose main archive has no
virtiofsd package; it has QEMU 7.2's own virtiofsd (/usr/lib/qemu/virtiofsd, package qemu-system-common,
which qemu-system-x86 brings), a real daemon of the same vhost-user-fs protocol, run as root with its
namespace sandbox, so QEMU's `vhost-user-fs-pci` completes the vhost-user handshake with it at realize (`-S`).
`lab_argv` turns qemu-server's options into that daemon's: `--shared-dir=P` is `-o source=P`, `--xattr`,
`--posix-acl` (which implies xattr in the Rust daemon, not in 7.2's: `-o posix_acl -o xattr`),
`--announce-submounts`, `--allow-direct-io` the `-o` options of the same meaning, `--cache=`
`auto`/`always` the same, `never` `none`, `metadata` (the Rust daemon's only) `auto`; `--syslog` and
`--inode-file-handles=prefer` (none in 7.2) are left out, and the daemon's own lines are not kept (a node's go
to syslog, not to the start task). The socket is a
temporary one (qemu_check rewrites QEMU's `-chardev` path to it), and the lab closes its copy as soon as the
daemon runs, so that a daemon that died makes QEMU's connect fail instead of wait. Known difference: 7.2's
daemon cannot share `/` itself (QEMU then reports `vhost_backend_init failed: Protocol error`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

VIRTIOFSD = "/usr/libexec/virtiofsd"  # Virtiofs.pm $virtiofsd_bin
LAB_VIRTIOFSD = "/usr/lib/qemu/virtiofsd"  # Debian 12's (qemu-system-common)
STOP_S = 2.0  # a daemon QEMU connected to ends at once when QEMU quits; one it never reached is stopped
_FLAGS = {
    "--xattr": "xattr",
    "--posix-acl": "posix_acl",  # and xattr (lab_argv)
    "--announce-submounts": "announce_submounts",
    "--allow-direct-io": "allow_direct_io",
}
_CACHE = {"auto": "auto", "always": "always", "never": "none", "metadata": "auto"}


def _on(value: str | None) -> bool:
    return (value or "0").lower() in ("1", "on", "yes", "true")


def qemu_server_argv(fd: int, options: Mapping[str, str], path: str, windows: bool) -> list[str]:
    """start_virtiofsd's command: `options` the virtiofsN property string's values, `path` the mapping's
    directory on the node, `windows` whether the guest is Windows (`--inode-file-handles=prefer`)."""
    argv = [VIRTIOFSD, f"--fd={fd}", f"--shared-dir={path}"]
    argv += ["--xattr"] if _on(options.get("expose-xattr")) else []
    argv += ["--posix-acl"] if _on(options.get("expose-acl")) else []
    argv += ["--announce-submounts"]
    argv += ["--allow-direct-io"] if _on(options.get("direct-io")) else []
    argv += [f"--cache={options['cache']}"] if options.get("cache") else []
    argv += ["--inode-file-handles=prefer"] if windows else []
    return [*argv, "--syslog"]


def lab_argv(argv: Sequence[str]) -> list[str]:
    """qemu-server's command as Debian 12's virtiofsd takes it (module docstring)."""
    lab = [LAB_VIRTIOFSD]
    for arg in argv[1:]:
        name, _, value = arg.partition("=")
        if name == "--fd":
            lab.append(arg)
        elif name == "--shared-dir":
            lab += ["-o", f"source={value}"]
        elif name == "--cache":
            lab += ["-o", f"cache={_CACHE[value]}"]
        elif arg in _FLAGS:
            lab += ["-o", _FLAGS[arg]]
            lab += ["-o", "xattr"] if arg == "--posix-acl" and "--xattr" not in argv else []
    return lab


@dataclass(frozen=True)
class Share:
    """One virtiofsN of the start: the lab's socket, the property string's values, the shared directory
    on this machine (the node's directory under the node's root), whether the guest is Windows."""

    socket: str
    options: Mapping[str, str]
    directory: str
    windows: bool = False


@contextlib.contextmanager
def running(shares: Sequence[Share]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A daemon per share, listening on its socket, until the block ends (then each that has not ended with
    QEMU's disconnect is stopped); yields the daemons."""
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for share in shares:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(share.socket)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(share.socket)
                listener.listen(1)
                fd = listener.fileno()
                argv = lab_argv(qemu_server_argv(fd, share.options, share.directory, share.windows))
                daemons.append(
                    subprocess.Popen(
                        argv,
                        pass_fds=(fd,),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        yield daemons
    finally:
        for daemon in daemons:
            try:
                daemon.wait(timeout=STOP_S if daemon.poll() is None else None)
            except subprocess.TimeoutExpired:
                daemon.terminate()
                daemon.wait()
