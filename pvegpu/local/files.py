"""Files on the operator's machine (the one running pyinfra) written whole: `write_whole`.

What pvegpu keeps there (a guest's key pair, the known_hosts lines, a DHCP guest's address, a create's record)
is never left empty or half-written. The content goes to a new temporary file in the same directory (a
unique name created exclusively, `O_CREAT|O_EXCL`, 0600 until it is given its mode), written to the last
byte (`os.write` may write less than asked), synced, and checked to hold exactly that many bytes; only then
is it renamed over the file and the directory synced. On any failure (a full disk: ENOSPC) the old file is
left as it was, the temporary file is removed, and `LocalWriteError` says so in one line:
`/home/op/.ssh/known_hosts: not written: No space left on device`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

_TEMP_SUFFIX = ".pvegpu-new"


class LocalWriteError(OSError):
    """One line naming the file: `<path>: not written: <reason>` (the old file is as it was), or, after the
    rename, `<path>: written, but its directory was not synced: <reason>`. An OSError, so a caller that
    reports an OSError in one line reports this one too."""


def write_whole(path: Path, content: str | bytes, mode: int) -> None:
    """`content` (text as UTF-8) into `path` with `mode`, whole or not at all (module docstring); the parent
    directory must exist. LocalWriteError on any failure."""
    data = content.encode() if isinstance(content, str) else content
    try:
        descriptor, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TEMP_SUFFIX, dir=path.parent)
    except OSError as error:
        raise _not_written(path, error) from None
    try:
        try:
            os.fchmod(descriptor, mode)  # mkstemp's 0600, or the umask, must not decide the file's mode
            _write_all(descriptor, data)
            os.fsync(descriptor)
            on_disk = os.fstat(descriptor).st_size
        finally:
            os.close(descriptor)
        if on_disk != len(data):
            raise LocalWriteError(f"{path}: not written: {on_disk} of {len(data)} bytes reached the disk")
        os.replace(temp, path)
    except LocalWriteError:
        _remove(temp)
        raise
    except OSError as error:
        _remove(temp)
        raise _not_written(path, error) from None
    _sync_directory(path)


def _write_all(descriptor: int, data: bytes) -> None:
    left = memoryview(data)
    while left:
        written = os.write(descriptor, left)
        if written <= 0:  # a regular file that takes nothing more: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left = left[written:]


def _sync_directory(path: Path) -> None:
    """Sync the rename: a crash after it must not bring the old file back."""
    try:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as error:
        reason = error.strerror or str(error)
        raise LocalWriteError(f"{path}: written, but its directory was not synced: {reason}") from None


def _not_written(path: Path, error: OSError) -> LocalWriteError:
    return LocalWriteError(f"{path}: not written: {error.strerror or error}")


def _remove(temp: str) -> None:
    with contextlib.suppress(OSError):  # the error that brought us here is the one to report
        os.unlink(temp)
