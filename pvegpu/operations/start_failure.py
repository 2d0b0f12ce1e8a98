"""A failed VM start in one line, with QEMU's own words.

qemu-server ends a start QEMU refused with the task error `start failed: QEMU exited with code 1`
(QemuServer.pm `vm_start_nolock`); QEMU's message itself (`kvm: -set device.hostpci0.0.x-nv-...: there is no
device "hostpci0" defined`, naming the part it refused) is only in the task log, as QEMU's stderr.
"""

from __future__ import annotations

from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError, TaskFailedError


def start_failure(api: PveClient, error: TaskFailedError) -> str:
    """The last line the failed start task printed before its end (QEMU's error), then the task's exit
    status in brackets; the exit status alone when the log cannot be read or says nothing more."""
    try:
        log = api.task_log(error.upid)
    except PveError:
        return error.message
    said = [line.strip() for line in log if line.strip() and not line.startswith("TASK ")]
    if not said or said[-1] in error.message:
        return error.message
    return f"{said[-1]} ({error.message})"
