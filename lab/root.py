"""The lab's Debian root: debootstrapped once, cached as a tarball, unpacked once as the shared overlay base.

`ensure_base()` returns `<cache>/base-<key>/`, the read-only lower layer of every lab host, building or
restoring what is missing. `<key>` hashes the suite, the package list and the customisation recipe below, so
changing any of them builds a new root; roots of other keys are deleted once no running host uses them.
The cache directory is `$PVEGPU_LAB_CACHE` (default /var/cache/pvegpu-lab): keep it where it survives between
CI runs; where it does not, the root is rebuilt (about 75 s on two cores; the tarball is 83 MiB).

Per-host state (hostname, machine-id, SSH host key, authorized key) is NOT in the root: `lab.hosts` writes it
into each host's overlay, so every host has its own identity.

Run as `python -m lab.root`: ensures the base and prints its path.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lab.errors import LabError

SUITE = "bookworm"
MIRROR = os.environ.get("PVEGPU_LAB_MIRROR", "http://deb.debian.org/debian")

# Beyond minbase: what v1 hosts need (sshd, real systemd for nspawn hosts, iproute2/procps/kmod/pciutils for
# facts and operators' habits) and what the next issues need for real boot-config runs (update-initramfs,
# update-grub). python3 is not needed by pyinfra; it keeps ad-hoc debugging on a host comfortable;
# python3-venv: the guest role's SGLang venv; prometheus-node-exporter: the exporter that
# roles/node_exporter.py keeps on every host (the lab guests cannot reach Debian's mirror to install them).
PACKAGES = (
    "dbus",
    "grub2-common",
    "initramfs-tools",
    "iproute2",
    "kmod",
    "openssh-server",
    "pciutils",
    "procps",
    "prometheus-node-exporter",
    "python3",
    "python3-venv",
    "systemd",
    "systemd-sysv",
)

# Files written into the root after debootstrap: (path, mode, content).
SSHD_CONFIG = """\
# pvegpu lab: root logs in with its per-host key only; the host key is generated per host.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
# No DNS inside the lab's network namespaces; no PAM/motd/lastlog work per connection.
UseDNS no
UsePAM no
PrintMotd no
PrintLastLog no
"""
FILES: tuple[tuple[str, int, str], ...] = (("etc/ssh/sshd_config.d/pvegpu-lab.conf", 0o644, SSHD_CONFIG),)
# Globs removed after debootstrap: the build's SSH host keys (each host gets its own) and apt's caches.
REMOVE = ("etc/ssh/ssh_host_*", "var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb")
# Exact owners, modes and file capabilities, both ways.
_TAR = ("tar", "--numeric-owner", "--xattrs", "--xattrs-include=*")


class RootBuildError(LabError):
    """Building or unpacking the root failed; the message holds the failing command's output tail."""


def cache_dir() -> Path:
    return Path(os.environ.get("PVEGPU_LAB_CACHE", "/var/cache/pvegpu-lab"))


def root_key() -> str:
    """Short hash of everything that defines the root's content."""
    recipe = json.dumps({"suite": SUITE, "packages": PACKAGES, "files": FILES, "remove": REMOVE})
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def tarball_path() -> Path:
    return cache_dir() / f"root-{SUITE}-{root_key()}.tar.zst"


def base_path() -> Path:
    return cache_dir() / f"base-{SUITE}-{root_key()}"


def _log(message: str) -> None:
    print(f"lab.root: {message}", file=sys.stderr, flush=True)


def _run(*argv: str | Path) -> None:
    """Run a build step quietly (debootstrap prints hundreds of lines); on failure, show its output's tail."""
    command = [str(a) for a in argv]
    result = subprocess.run(command, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise RootBuildError(f"`{' '.join(command)}` failed ({result.returncode}):\n{tail}")


def _build_tarball(tarball: Path) -> None:
    build = tarball.with_name(tarball.name + ".build")
    shutil.rmtree(build, ignore_errors=True)
    started = time.monotonic()
    _log(f"debootstrap {SUITE} (+{len(PACKAGES)} packages) into {build}; cached afterwards")
    _run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, build, MIRROR)
    for pattern in REMOVE:
        for path in build.glob(pattern):
            if not path.is_dir():  # keep e.g. var/lib/apt/lists/partial
                path.unlink()
    for rel, mode, content in FILES:
        path = build / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(mode)
    partial = tarball.with_name(tarball.name + ".partial")
    _run(*_TAR, "-I", "zstd -T0 -3", "-cpf", partial, "-C", build, ".")
    partial.rename(tarball)
    shutil.rmtree(build)
    _log(f"built {tarball} ({tarball.stat().st_size >> 20} MiB) in {time.monotonic() - started:.0f} s")


def _unpack(tarball: Path, base: Path) -> None:
    partial = base.with_name(base.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    started = time.monotonic()
    _run(*_TAR, "-I", "zstd", "-xpf", tarball, "-C", partial)
    partial.rename(base)
    _log(f"unpacked {base} in {time.monotonic() - started:.1f} s")


def _remove_stale(keep: set[Path]) -> None:
    """Delete roots of other keys, except a base that a mounted overlay still uses as its lower layer."""
    mounts = Path("/proc/self/mountinfo").read_text()
    for path in cache_dir().glob(f"*-{SUITE}-*"):
        if path in keep or f"lowerdir={path}" in mounts:
            continue
        _log(f"removing stale {path}")
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def ensure_base() -> Path:
    """Return the unpacked base root, debootstrapping and/or unpacking it first where missing."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    base, tarball = base_path(), tarball_path()
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; others wait and find it done
        if not base.is_dir():
            if not tarball.is_file():
                _build_tarball(tarball)
            _unpack(tarball, base)
        _remove_stale({base, tarball})
    return base


if __name__ == "__main__":
    try:
        print(ensure_base())
    except RootBuildError as error:
        sys.exit(f"lab.root: {error}")
