"""pvegpu.local.files.write_whole: a file on the operator's machine is written whole or left as it was, and a
failed write is one line naming the file; the callers (known_hosts, guest keys, create records) use it.

`os.write` is replaced to play the kernel's part: a short write (1 byte per call), a full disk part-way
(ENOSPC after some bytes), a write that takes nothing, and one that says it wrote more than reached the file.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.local.create_records import CreateLedger
from pvegpu.local.files import LocalWriteError, write_whole
from pvegpu.local.guest_keys import record_known_host
from pvegpu.operations.guest_known import GuestIdentity, _record
from pvegpu.plan.create_proof import CreateRecord

OLD = b"203.0.113.10 ssh-ed25519 AAAAold\n"
NEW = "203.0.113.10 ssh-ed25519 AAAAnew\n198.51.100.7 ssh-ed25519 AAAAother\n"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAjx3dFGVH5ncb4aJKg4ZGvqGEP7s8vQbK2S4/V9qL1m"

_real_write = os.write


def _files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def _full_after(room: int) -> Callable[[int, memoryview], int]:
    """os.write on a disk with `room` bytes left: what fits is written, then ENOSPC."""

    def write(descriptor: int, data: memoryview) -> int:
        nonlocal room
        chunk = bytes(data)[:room]
        if not chunk:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        room -= len(chunk)
        return _real_write(descriptor, chunk)

    return write


def test_create_writes_the_file_with_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    previous = os.umask(0o077)
    try:
        write_whole(path, NEW, 0o644)
    finally:
        os.umask(previous)

    assert (path.read_text(), path.stat().st_mode & 0o777, _files(tmp_path)) == (NEW, 0o644, ["known_hosts"])


def test_update_replaces_the_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "pve1-qemu-100.json"
    path.write_bytes(OLD)

    write_whole(path, b'{"sent": 1, "upid": null}\n', 0o600)

    assert path.read_bytes() == b'{"sent": 1, "upid": null}\n'
    assert (path.stat().st_mode & 0o777, _files(tmp_path)) == (0o600, ["pve1-qemu-100.json"])


def test_short_writes_still_write_the_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "known_hosts"
    path.write_bytes(OLD)
    calls: list[int] = []

    def one_byte(descriptor: int, data: memoryview) -> int:
        calls.append(len(bytes(data)))
        return _real_write(descriptor, bytes(data)[:1])

    monkeypatch.setattr(os, "write", one_byte)
    write_whole(path, NEW, 0o644)
    monkeypatch.undo()

    assert path.read_text() == NEW
    assert calls == list(range(len(NEW), 0, -1))  # each call is handed the rest
    assert _files(tmp_path) == ["known_hosts"]


def test_error_a_full_disk_mid_write_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "known_hosts"
    path.write_bytes(OLD)
    path.chmod(0o640)

    monkeypatch.setattr(os, "write", _full_after(10))
    with pytest.raises(LocalWriteError) as raised:
        write_whole(path, NEW, 0o644)
    monkeypatch.undo()

    assert str(raised.value) == f"{path}: not written: No space left on device"
    assert isinstance(raised.value, OSError)
    assert (path.read_bytes(), path.stat().st_mode & 0o777, _files(tmp_path)) == (OLD, 0o640, ["known_hosts"])


def test_error_a_write_that_takes_nothing_is_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "known_hosts"
    path.write_bytes(OLD)

    monkeypatch.setattr(os, "write", lambda _descriptor, _data: 0)
    with pytest.raises(LocalWriteError) as raised:
        write_whole(path, NEW, 0o644)
    monkeypatch.undo()

    assert str(raised.value) == f"{path}: not written: No space left on device"
    assert (path.read_bytes(), _files(tmp_path)) == (OLD, ["known_hosts"])


def test_error_fewer_bytes_on_disk_than_written_is_not_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "known_hosts"
    path.write_bytes(OLD)

    def claims_all(descriptor: int, data: memoryview) -> int:
        _real_write(descriptor, bytes(data)[:5])
        return len(bytes(data))

    monkeypatch.setattr(os, "write", claims_all)
    with pytest.raises(LocalWriteError) as raised:
        write_whole(path, NEW, 0o644)
    monkeypatch.undo()

    assert str(raised.value) == f"{path}: not written: 5 of {len(NEW)} bytes reached the disk"
    assert (path.read_bytes(), _files(tmp_path)) == (OLD, ["known_hosts"])


def test_error_a_missing_directory_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "guest-keys" / "gpu-vm_ed25519"

    with pytest.raises(LocalWriteError) as raised:
        write_whole(path, "secret", 0o600)

    assert str(raised.value) == f"{path}: not written: No such file or directory"
    assert _files(tmp_path) == []


def test_error_known_hosts_on_a_full_disk_fails_the_guest_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_bytes(OLD)
    identity = GuestIdentity("gpu-vm", known_hosts, tmp_path / "gpu-vm_ed25519", KEY, None)

    monkeypatch.setattr(os, "write", _full_after(0))
    with pytest.raises(OperationError) as raised:
        _record(identity, "203.0.113.10", True)
    monkeypatch.undo()

    assert str(raised.value) == f"guest gpu-vm: {known_hosts}: not written: No space left on device"
    assert (known_hosts.read_bytes(), _files(tmp_path)) == (OLD, ["known_hosts"])


def test_record_known_host_survives_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_bytes(OLD)

    monkeypatch.setattr(os, "write", lambda descriptor, data: _real_write(descriptor, bytes(data)[:1]))
    record_known_host(known_hosts, "203.0.113.10", KEY)
    monkeypatch.undo()

    assert known_hosts.read_text() == f"203.0.113.10 {KEY}\n"


def test_error_a_create_record_on_a_full_disk_keeps_the_old_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = CreateLedger(tmp_path / "tasks", "root@pam")
    ledger.write("pve1", "qemu", 100, CreateRecord(upid=None, sent=1700000000))
    before = ledger.path("pve1", "qemu", 100).read_bytes()

    monkeypatch.setattr(os, "write", _full_after(4))
    with pytest.raises(LocalWriteError) as raised:  # an OSError: pve_guest reports it in one line
        ledger.write("pve1", "qemu", 100, CreateRecord(upid="UPID:pve1:x", sent=1700000000))
    monkeypatch.undo()

    assert str(raised.value) == f"{tmp_path}/tasks/pve1-qemu-100.json: not written: No space left on device"
    assert ledger.path("pve1", "qemu", 100).read_bytes() == before
    assert _files(tmp_path / "tasks") == ["pve1-qemu-100.json"]
