"""What the running SGLang service started from, so that a run restarts it from what the host shows, not from
what the run itself wrote: a run that stopped between writing the service's files and restarting it (a cut
connection, a failed restart, Ctrl-C) is finished by the next one, which writes nothing. Pure.

At every start (pvegpu's, a boot's, systemd's `Restart=on-failure`, an operator's) sglang.service runs
`record_start(files)` first, as root (`+`) and never failing the start (`-`): the sha256 of each file the
service starts from (its unit, the environment file, the keys' script, the NCCL topology file, the store's
mount unit) into `STARTED_RECORD`, on /run (a boot starts it afresh), and the digest of the venv's
`sglang-<version>.dist-info/METADATA`, whose path names the SGLang version the service loads (a run that
upgraded the venv and stopped before the restart leaves the service on the old version). The host's state
read reads that record with the files' digests and the venv's version; `restart_reason` says why the running
service must restart (a file on disk is not the one it started from, or the venv holds another SGLang), or
None. Without a record (a service started before the unit recorded) there is nothing to compare: the service
is taken to run what is on disk; a record without the venv's entry (an older unit) compares files only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from packaging.version import InvalidVersion, Version

from pvegpu.plan.sglang_service import SERVICE, systemd_word

STARTED_RECORD = "/run/pvegpu-sglang.started"
# sha256sum -z: one `<digest>  <path>` per file, NUL-terminated, no escaping (the store's mount unit has `\`).
# The venv is the script's $0 (quoted: only the dist-info's part is a pattern), the files its arguments.
_METADATA = "/lib/python*/site-packages/sglang-*.dist-info/METADATA"
_SCRIPT = f'sha256sum -z -- "$@" "$0"{_METADATA} > {STARTED_RECORD}'
_DIGEST = re.compile(r"([0-9a-f]{64})  (/.+)", re.DOTALL)
_VERSION = re.compile(r"/lib/python[^/]*/site-packages/sglang-([^/]+)\.dist-info/METADATA")


def record_start(files: Sequence[str], venv: str) -> str:
    """The `ExecStartPre=` value that records the digests of `files` and of `venv`'s SGLang metadata (module
    docstring)."""
    return "-+" + " ".join(systemd_word(word) for word in ("/bin/sh", "-c", _SCRIPT, venv, *files))


def started_digests(record: str) -> dict[str, str]:
    """`STARTED_RECORD`'s text -> {path: sha256}; an entry of another shape (a cut write) is left out."""
    entries = (_DIGEST.fullmatch(entry) for entry in record.split("\0") if entry)
    return {match[2]: match[1] for match in entries if match is not None}


def started_version(record: str, venv: str) -> str | None:
    """The SGLang version the service started with, from `venv`'s metadata entry of `record`; None without
    one."""
    for path in started_digests(record):
        match = _VERSION.fullmatch(path.removeprefix(venv.rstrip("/"))) if path.startswith(venv) else None
        if match is not None:
            return match[1]
    return None


def _same_version(dist_info: str, metadata: str) -> bool:
    """Whether a dist-info's version (pip names it from the wheel's file name) and a METADATA's `Version:` are
    one release: PEP 440 equality, as the two may be spelled apart (`1.0-1` and `1.0.post1`)."""
    try:
        return Version(dist_info) == Version(metadata)
    except InvalidVersion:
        return dist_info == metadata


def restart_reason(
    record: str | None,
    on_disk: Mapping[str, str | None],
    *,
    running: bool,
    venv: str,
    venv_version: str | None,
) -> str | None:
    """Why the running service must restart: a file of `on_disk` ({path: sha256 now, None: missing}) that
    differs from the one it started from as `record` shows it, or `venv` holding SGLang `venv_version` (as
    the state read shows it) where the record shows it started with another; None when it is not running
    (its start comes from elsewhere), without a record, or when it runs what is on disk."""
    if not running or record is None:
        return None
    started = started_digests(record)
    differs = [path for path, digest in on_disk.items() if started.get(path) != digest]
    if differs:
        return (
            f"{SERVICE} runs with another {', '.join(differs)} than the one on disk (a run stopped before "
            "restarting it): restarting it"
        )
    version = started_version(record, venv)
    if version is None or venv_version is None or _same_version(version, venv_version):
        return None
    return (
        f"{SERVICE} runs SGLang {version} and {venv} holds {venv_version} (a run stopped before restarting "
        "it): restarting it"
    )
