"""pmxcfs as the stand-in uses /etc/pve: file reads, atomic writes, the cluster lock, a guest config's lock
and the files' SHA-1 digests."""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DieError

if TYPE_CHECKING:
    from .settings import Settings


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    partial.write_text(text)
    partial.rename(path)


@contextmanager
def locked(settings: Settings) -> Iterator[None]:
    """One lock for every write (cfs locks and per-VM flocks in Proxmox): pyinfra runs hosts in parallel."""
    lock = settings.path("/run/lock/pvegpu-lab-pvesh.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextmanager
def vm_config_locked(settings: Settings, vmid: str, timeout_s: float = 10.0) -> Iterator[None]:
    """PVE::AbstractConfig `lock_config` (QemuConfig `config_file_lock`, 10 s): the VM's config lock, an
    flock on /var/lock/qemu-server/lock-<vmid>.conf; PVE::Tools `lock_file_full`'s texts when it waits or
    times out."""
    name = f"/var/lock/qemu-server/lock-{vmid}.conf"
    lock = settings.path(name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write("trying to acquire lock...\n")
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise DieError(f"can't lock file '{name}' - got timeout\n") from None
                    time.sleep(0.05)
            sys.stderr.write(" OK\n")
        yield


def text_or_none(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None
