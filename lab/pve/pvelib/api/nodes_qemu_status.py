"""`/nodes/{node}/qemu/{vmid}/status/...` and `/resize` (qemu-server API2/Qemu.pm)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from .. import access
from ..cloudinit import boot_disk, cloud_init_data, net0_mac
from ..drives import Drive
from ..errors import DieError
from ..formats import BOOL
from ..guest_config import GuestConfig, apply_pending, guest_path, load_guest, write_guest_config
from ..guest_schema import DRIVE_NAMES
from ..hookscript import exec_hookscript
from ..hypervisor import (
    IDLE_COUNTERS,
    hypervisor_request,
    is_running,
    qemu_running_pid,
    record_path,
    start_placeholder,
    stop_placeholder,
)
from ..jsonschema import P, parse_boolean
from ..mapping_dir import virtiofs_dirs
from ..permissions import check_root_params
from ..pmxcfs import locked, vm_config_locked, write_atomic
from ..rest import VMS, Call, Endpoint, Json
from ..storage import format_size, image_size, parse_size, parse_volume
from ..sysfs import numa_nodes, passthrough_devices
from ..tasks import run_task


def get_qemu_status(call: Call) -> Json:
    conf = load_guest(call, "qemu")
    running = is_running(call)
    values = conf.main
    memory = re.match(r"(?:current=)?(\d+)", values.get("memory", "512"))
    cores, sockets = int(values.get("cores", "1")), int(values.get("sockets", "1"))
    status: dict[str, Any] = {
        "vmid": int(call.path_params["vmid"]),
        "status": "running" if running else "stopped",
        "qmpstatus": "running" if running else "stopped",
        "name": values.get("name", f"VM {call.path_params['vmid']}"),
        "cpus": cores * sockets,
        "maxmem": int(memory.group(1) if memory else 512) * 1024 * 1024,
        **IDLE_COUNTERS,
    }
    for key in ("lock", "tags"):
        if key in values:
            status[key] = values[key]
    if parse_boolean(values.get("agent", "0").split(",")[0].removeprefix("enabled=")) == 1:
        status["agent"] = 1
    if running:
        record = json.loads(record_path(call).read_text())
        status["pid"] = qemu_running_pid(call.settings, call.path_params["vmid"])
        status["uptime"] = max(0, int(time.time()) - record["started"])
        status["running-machine"] = record["machine"]
        status["running-qemu"] = "9.2.0"
    return status


def start_qemu(call: Call) -> Json:
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock",))

    def worker(emit: Callable[[str], None]) -> None:
        # qemu-server vm_start: everything below, the pre-start hook included, under lock_config($vmid).
        with vm_config_locked(call.settings, vmid):
            start_locked(emit)

    def start_locked(emit: Callable[[str], None]) -> None:
        with locked(call.settings):
            if not guest_path(call, "qemu").is_file():
                raise DieError(
                    f"unable to find configuration file for VM {vmid} on node '{call.settings.node}'\n"
                )
            conf = load_guest(call, "qemu")
            if parse_boolean(conf.main.get("template", "0")) == 1:
                raise DieError("you can't start a vm if it's a template\n")
            if "lock" in conf.main and not call.params.get("skiplock"):
                raise DieError(f"VM is locked ({conf.main['lock']})\n")
            if is_running(call):
                raise DieError(f"VM {vmid} already running\n")
            staged = GuestConfig(dict(conf.main), dict(conf.pending), conf.raw_lxc, conf.digest)
            apply_pending(staged)
            cloud_init = cloud_init_data(call.settings, vmid, staged.main)
            if conf.pending:
                write_atomic(guest_path(call, "qemu"), write_guest_config(staged, "[PENDING]"))
        # vm_start_nolock runs the pre-start hook here, before it checks the mappings: under the VM's config
        # lock (a hook that changes its VM's config waits for it, as on Proxmox) but outside the stand-in's
        # one write lock (Proxmox's cfs lock of pci.cfg is another), as the hook may write a mapping.
        exec_hookscript(call.settings, staged.main, vmid, "pre-start", emit)
        with locked(call.settings):
            devices = passthrough_devices(call, staged.main)
            numa_nodes(call.settings, staged.main)
            virtiofs = virtiofs_dirs(call.settings, staged.main)  # config_to_command: after the memory
            disk = boot_disk(call.settings, staged.main)
        machine = staged.main.get("machine", "pc").split(",")[0]
        request = {
            "action": "start",
            "vmid": int(vmid),
            "name": staged.main.get("name"),
            "machine": machine,
            "bios": staged.main.get("bios", "seabios"),
            "devices": devices,
            "virtiofs": virtiofs,
            "disk": disk,
            "cloud_init": cloud_init,
            "mac": net0_mac(staged.main),
            "config": staged.main,  # the lab hypervisor builds QEMU's command line from it
        }
        answer = hypervisor_request(call, request, emit=emit)
        record = {
            "guest_pid": answer["pid"],  # the lab host's, outside the node
            "started": int(time.time()),
            "machine": "pc-q35-9.2+pve1" if "q35" in machine else "pc-i440fx-9.2+pve1",
        }
        record_path(call).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(record_path(call), json.dumps(record))
        start_placeholder(call, str(staged.main.get("name", f"VM {vmid}")))

    return run_task(call, "qmstart", vmid, worker)


def stop_qemu(call: Call, task_type: str) -> Json:
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock", "keepActive"))

    def worker(_emit: Callable[[str], None]) -> None:
        if not guest_path(call, "qemu").is_file():
            raise DieError(
                f"unable to find configuration file for VM {vmid} on node '{call.settings.node}'\n"
            )
        if not is_running(call):
            return
        hypervisor_request(call, {"action": "stop", "vmid": int(vmid)})
        stop_placeholder(call)

    return run_task(call, task_type, vmid, worker)


def resize_qemu(call: Call) -> Json:
    """API2/Qemu.pm `resize_vm` (task `resize`): grows the disk's volume and records `size=`. The stand-in's
    volume size is the `size=` its config records (else the data file's image size)."""
    vmid, key, text = call.path_params["vmid"], call.params["disk"], call.params["size"]
    check_root_params(call, ("skiplock",))

    def worker(_emit: Callable[[str], None]) -> None:
        with locked(call.settings):
            conf = load_guest(call, "qemu")
            if call.params.get("digest") and call.params["digest"] != conf.digest:
                raise DieError("checksum mismatch (file change by other user?)\n")
            if "lock" in conf.main and not call.params.get("skiplock"):
                raise DieError(f"VM is locked ({conf.main['lock']})\n")
            if key not in conf.main:
                raise DieError(f"disk '{key}' does not exist\n")
            drive = Drive.parse(conf.main[key])
            if drive.is_cdrom:
                raise DieError("you can't resize a cdrom\n")
            volume = parse_volume(call.settings, drive.file)
            rpcenv = call.rpcenv
            rpcenv.check(rpcenv.user, f"/storage/{volume.storage.id}", ("Datastore.AllocateSpace",))
            data = call.settings.path(volume.file)
            size = parse_size(drive.options.get("size", "")) if "size" in drive.options else None
            if size is None and data.is_file():
                size = image_size(data)
            if size is None:
                raise DieError(f"Could not determine current size of volume '{drive.file}'\n")
            grow = text.startswith("+")
            new = parse_size(text.lstrip("+"))
            assert new is not None
            new += size if grow else 0
            if new < size:
                raise DieError("shrinking disks is not supported\n")
            if new == size:
                return
            drive.options["size"] = format_size(new)
            conf.main[key] = drive.print()
            write_atomic(guest_path(call, "qemu"), write_guest_config(conf, "[PENDING]"))

    return run_task(call, "resize", vmid, worker)


ROUTES: list[tuple[str, str, Endpoint]] = [
    (
        "get",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/current",
        Endpoint("GET", {}, get_qemu_status),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/start",
        Endpoint("POST", {"skiplock": BOOL, "timeout": P(type="integer", minimum=0)}, start_qemu),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/stop",
        Endpoint(
            "POST",
            {
                "skiplock": BOOL,
                "timeout": P(type="integer", minimum=0),
                "keepActive": BOOL,
                "overrule-shutdown": BOOL,
            },
            lambda call: stop_qemu(call, "qmstop"),
        ),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/status/shutdown",
        Endpoint(
            "POST",
            {
                "skiplock": BOOL,
                "timeout": P(type="integer", minimum=0),
                "forceStop": BOOL,
                "keepActive": BOOL,
            },
            lambda call: stop_qemu(call, "qmshutdown"),
        ),
    ),
    (
        "set",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/resize",
        Endpoint(
            "PUT",
            {
                "disk": P(optional=False, enum=DRIVE_NAMES),
                "size": P(optional=False, pattern=r"\+?\d+(\.\d+)?[KMGT]?"),
                "digest": P(max_length=40),
                "skiplock": BOOL,
            },
            resize_qemu,
        ),
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/nodes/{node}/qemu/{vmid}/status/current"): access.Perm(VMS, ("VM.Audit",)),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/start"): access.Perm(VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/stop"): access.Perm(VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/shutdown"): access.Perm(VMS, ("VM.PowerMgmt",)),
    ("PUT", "/nodes/{node}/qemu/{vmid}/resize"): access.Perm(VMS, ("VM.Config.Disk",)),
}
