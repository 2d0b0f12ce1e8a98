"""A guest's hookscript (qemu-server check_hookscript, PVE::GuestHelpers exec_hookscript)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import DieError
from .storage import parse_volume

if TYPE_CHECKING:
    from .settings import Settings


def check_hookscript(settings: Settings, volid: str) -> Path:
    """PVE::GuestHelpers::check_hookscript: the script's path, or DieError with Proxmox's text."""
    volume = parse_volume(settings, volid)
    path = settings.path(volume.file)
    if volume.vtype != "snippets":
        raise DieError(f"'{volid}' is not in the snippets directory\n")
    if not path.is_file():
        raise DieError(f"script '{volid}' does not exist\n")
    if not os.access(path, os.X_OK):
        raise DieError(f"script '{volid}' is not executable\n")
    return path


def exec_hookscript(
    settings: Settings, conf: dict[str, str], vmid: str, phase: str, emit: Callable[[str], None]
) -> None:
    """PVE::GuestHelpers::exec_hookscript with stop_on_error (pre-start): run `<script> <vmid> <phase>`, its
    output to the task log; a failure dies with `hookscript error for <vmid> on <phase>: <error>`."""
    if not conf.get("hookscript"):
        return
    try:
        path = check_hookscript(settings, conf["hookscript"])
        argv = [str(path), vmid, phase]
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        for line in done.stdout.splitlines():
            emit(line)
        if done.returncode != 0:
            raise DieError(f"command '{' '.join(argv)}' failed: exit code {done.returncode}\n")
    except DieError as error:
        raise DieError(f"hookscript error for {vmid} on {phase}: {error.text}\n") from None
