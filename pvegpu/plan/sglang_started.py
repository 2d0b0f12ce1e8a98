"""What the running SGLang service started from, so that a run restarts it from what the host shows, not from
what the run itself wrote: a run that stopped between writing the service's files and restarting it (a cut
connection, a failed restart, Ctrl-C) is finished by the next one, which writes nothing. Pure.

At every start (pvegpu's, a boot's, systemd's `Restart=on-failure`, an operator's) sglang.service runs
`record_start(files)` first, as root (`+`) and never failing the start (`-`): the sha256 of each file the
service starts from (its unit, the environment file, the keys' script, the NCCL topology file, the store's
mount unit) into `STARTED_RECORD`, on /run (a boot starts it afresh). The host's state read reads that record
with the files' digests; `restart_reason` says why the running service must restart (a file on disk is not
the one it started from), or None. Without a record (a service started before the unit recorded) there is
nothing to compare: the service is taken to run what is on disk.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pvegpu.plan.sglang_service import SERVICE, systemd_word

STARTED_RECORD = "/run/pvegpu-sglang.started"
# sha256sum -z: one `<digest>  <path>` per file, NUL-terminated, no escaping (the store's mount unit has `\`).
_SCRIPT = f'sha256sum -z -- "$@" > {STARTED_RECORD}'
_DIGEST = re.compile(r"([0-9a-f]{64})  (/.+)", re.DOTALL)


def record_start(files: Sequence[str]) -> str:
    """The `ExecStartPre=` value that records the digests of `files` (module docstring)."""
    return "-+" + " ".join(systemd_word(word) for word in ("/bin/sh", "-c", _SCRIPT, "sh", *files))


def started_digests(record: str) -> dict[str, str]:
    """`STARTED_RECORD`'s text -> {path: sha256}; an entry of another shape (a cut write) is left out."""
    entries = (_DIGEST.fullmatch(entry) for entry in record.split("\0") if entry)
    return {match[2]: match[1] for match in entries if match is not None}


def restart_reason(record: str | None, on_disk: Mapping[str, str | None], *, running: bool) -> str | None:
    """Why the running service must restart: a file of `on_disk` ({path: sha256 now, None: missing}) that
    differs from the one it started from as `record` shows it; None when it is not running (its start comes
    from elsewhere), without a record, or when every file is the one it started from."""
    if not running or record is None:
        return None
    started = started_digests(record)
    differs = [path for path, digest in on_disk.items() if started.get(path) != digest]
    if not differs:
        return None
    return (
        f"{SERVICE} runs with another {', '.join(differs)} than the one on disk (a run stopped before "
        "restarting it): restarting it"
    )
