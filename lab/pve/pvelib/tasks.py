"""Tasks (PVE::RESTEnvironment fork_worker, PVE::Tools upid): UPIDs, task logs and the task index."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DieError

if TYPE_CHECKING:
    from .rest import Call
    from .settings import Settings

UPID_RE = re.compile(
    r"UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):"
    r"([^:\s/]+):([^:\s/]*):([^:\s/]+):"
)


def process_start(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def task_log_path(settings: Settings, upid: str, starttime: str) -> Path:
    return settings.path(f"/var/log/pve/tasks/{starttime[-1].upper()}/{upid}")


def run_task(
    call: Call, task_type: str, task_id: str, worker: Callable[[Callable[[str], None]], None]
) -> str:
    """fork_worker under pvesh (sync): worker output to stdout and the log; returns the UPID. A worker line
    `WARN: <text>` is a warning (RESTEnvironment `warn`, `log_warn`): a task that logged N of them and did
    not die ends `TASK WARNINGS: N`, which pve-common's UPID.pm `status_is_error` counts as success."""
    settings = call.settings
    pid = os.getpid()
    starttime = f"{int(time.time()):08X}"
    user = call.rpcenv.user  # the UPID names who started the task (a token: `user@realm!name`)
    upid = (
        f"UPID:{settings.node}:{pid:08X}:{process_start(pid):08X}:{starttime}:{task_type}:{task_id}:{user}:"
    )
    log_path = task_log_path(settings, upid, starttime)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")  # the log exists while the task runs: a killed worker leaves it unfinished

    warnings = 0

    def emit(line: str) -> None:
        nonlocal warnings
        warnings += line.startswith("WARN: ")
        with log_path.open("a") as log:
            log.write(line + "\n")
        sys.stdout.write(line + "\n")

    status = "OK"
    try:
        worker(emit)
        ending = f"TASK WARNINGS: {warnings}\n" if warnings else "TASK OK\n"
        status = f"WARNINGS: {warnings}" if warnings else status
    except DieError as error:
        # fork_worker: chomp one "\n", then every remaining "\n" becomes a space.
        message = error.text[:-1] if error.text.endswith("\n") else error.text
        status = message.replace("\n", " ")
        sys.stderr.write(status + "\n")
        ending = f"\nTASK ERROR: {status}\n"
    with log_path.open("a") as log:
        log.write(ending)
    with settings.path("/var/log/pve/tasks/index").open("a") as index:
        index.write(f"{upid} {int(time.time()):08X} {status}\n")
    return upid


def print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
