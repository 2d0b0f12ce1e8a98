"""The guests' processes: qemu-server's pidfile check, the placeholder process of a running VM, and the
requests to the lab hypervisor (lab/pve/hypervisor.py) that bring guest lab hosts up and down."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DieError
from .pmxcfs import write_atomic

if TYPE_CHECKING:
    from .rest import Call
    from .settings import Settings

# The usage counters of a guest's status/current: the stand-in runs nothing, so they stay 0.
IDLE_COUNTERS: dict[str, object] = {
    "mem": 0,
    "maxdisk": 0,
    "disk": 0,
    "uptime": 0,
    "cpu": 0,
    "netin": 0,
    "netout": 0,
    "diskread": 0,
    "diskwrite": 0,
    "ha": {"managed": 0},
}


QEMU_RUN_DIR = "/var/run/qemu-server"  # qemu-server Helpers.pm $var_run_tmpdir (vm_pidfile_name)


QEMU_RECORD_DIR = "/var/lib/pvegpu-lab/qemu"  # the stand-in's own: <vmid>.json, start time and machine


# The running VM's process: python3 named /usr/bin/kvm (qemu-server's parse_cmdline wants `kvm$` or
# `qemu-*`), writing its PID to the pidfile as QEMU's -pidfile does, alive while the file names it. One line
# (parse_cmdline reads /proc/<pid>/cmdline as a line).
_PLACEHOLDER = (
    "import os,time;f={path!r};t=f+'.tmp';open(t,'w').write('%d\\n'%os.getpid());os.replace(t,f);"
    "any(time.sleep(1) for _ in iter(lambda:open(f).read()=='%d\\n'%os.getpid(),False))"
)


def qemu_pidfile(vmid: str) -> str:
    """PVE::QemuServer::Helpers::vm_pidfile_name."""
    return f"{QEMU_RUN_DIR}/{vmid}.pid"


def _running_path(call: Call) -> Path:
    return call.settings.path(qemu_pidfile(call.path_params["vmid"]))


def record_path(call: Call) -> Path:
    return call.settings.path(f"{QEMU_RECORD_DIR}/{call.path_params['vmid']}.json")


def qemu_running_pid(settings: Settings, vmid: str) -> int | None:
    """PVE::QemuServer::Helpers `instance_running_locally` (via `vm_running_locally`): the PID the VM's
    pidfile holds (a first line of digits) when /proc/<pid>/cmdline (read as one line, split at NUL) is a
    `kvm`/`qemu-*` command whose `-pidfile` is that pidfile and /proc/<pid>/stat is not a zombie's; else
    None."""
    pidfile = qemu_pidfile(vmid)
    try:
        first = settings.path(pidfile).read_text().split("\n")[0]
    except (OSError, UnicodeDecodeError):
        return None
    if not re.fullmatch(r"[0-9]+", first):
        return None
    try:
        params = Path(f"/proc/{first}/cmdline").read_bytes().split(b"\n")[0].split(b"\0")
        state = Path(f"/proc/{first}/stat").read_text().rpartition(") ")[2].split(" ")[0]
    except OSError:
        return None
    command = params[0].decode(errors="replace")
    if not re.search(r"kvm$", command) and not re.search(r"(?:^|/)qemu-[^/]+$", command):
        return None
    options: dict[str, str | None] = {}
    pending: str | None = None
    for raw in params:
        param = raw.decode(errors="replace")
        if not param or param == "0":
            continue  # Perl's `next if !$p`
        if option := re.fullmatch(r"--?(.*)", param, re.DOTALL):
            if pending is not None:
                options[pending] = None
            pending = option.group(1)
        elif pending is not None:
            options[pending], pending = param, None
    if options.get("pidfile") != pidfile or state in ("", "Z"):
        return None
    return int(first)


def is_running(call: Call) -> bool:
    return qemu_running_pid(call.settings, call.path_params["vmid"]) is not None


def start_placeholder(call: Call, name: str) -> int:
    """The running VM's process (QEMU_RUN_DIR's comment), detached (its own session, reparented to the
    node's init); returns its PID once it wrote the pidfile, as QEMU's -daemonize returns."""
    vmid = call.path_params["vmid"]
    path = _running_path(call)
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["/usr/bin/kvm", "-c", _PLACEHOLDER.format(path=str(path)), "-id", vmid, "-name", name]
    argv += ["-pidfile", qemu_pidfile(vmid), "-daemonize"]
    read_end, write_end = os.pipe()
    if os.fork() == 0:  # the child starts the process and exits: its parent becomes init
        os.setsid()
        child = subprocess.Popen(
            argv,
            executable=sys.executable,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        os.write(write_end, str(child.pid).encode())
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32) or b"0")
    os.close(read_end)
    os.wait()
    deadline = time.monotonic() + 10
    while qemu_running_pid(call.settings, vmid) != pid:
        if time.monotonic() > deadline:
            raise DieError(f"start failed: the VM process {pid} did not write {qemu_pidfile(vmid)}\n")
        time.sleep(0.02)
    return pid


def stop_placeholder(call: Call) -> None:
    """End the running VM's process (SIGTERM) and wait until it is gone; QEMU removes its pidfile as it
    exits, the stand-in does it for it."""
    pid = qemu_running_pid(call.settings, call.path_params["vmid"])
    _running_path(call).unlink(missing_ok=True)
    record_path(call).unlink(missing_ok=True)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split(" ")[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.02)


def hypervisor_request(
    call: Call,
    request: dict[str, Any],
    failure: str = "start failed: ",
    emit: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Ask the lab hypervisor (outside the node) to start/stop a VM's guest or a CT's container host, or
    to run a guest agent command; wait for its answer (requests: lab/pve/hypervisor.py). A refusal fails
    with `<failure><error>`, its `log` lines (QEMU's stderr, as run_command passes it on) to `emit` first."""
    settings = call.settings
    if settings.hypervisor_dir is None:
        return {"ok": True, "pid": os.getpid()}
    folder = settings.hypervisor_dir
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{request['vmid']}-{request['action']}-{uuid.uuid4().hex[:8]}"
    write_atomic(folder / f"{name}.request", json.dumps(request, sort_keys=True))
    answer_path = folder / f"{name}.answer"
    deadline = time.monotonic() + settings.hypervisor_timeout_s
    while not answer_path.is_file():
        if time.monotonic() > deadline:
            (folder / f"{name}.request").unlink(missing_ok=True)
            raise DieError(f"lab hypervisor did not answer within {settings.hypervisor_timeout_s:.0f} s\n")
        time.sleep(0.1)
    answer: dict[str, Any] = json.loads(answer_path.read_text())
    answer_path.unlink()
    if not answer.get("ok"):
        if emit is not None:
            for line in answer.get("log", []):
                emit(line)
        raise DieError(f"{failure}{answer.get('error', 'lab hypervisor failed')}\n")
    return answer


def lxc_running_path(call: Call) -> Path:
    return call.settings.path(f"/run/lxc/{call.path_params['vmid']}.running")
