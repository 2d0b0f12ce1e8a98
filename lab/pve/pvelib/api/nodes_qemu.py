"""`/nodes/{node}/qemu[/{vmid}[/config]]`: list, create, destroy, config (qemu-server API2/Qemu.pm)."""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import access, ha
from ..drives import (
    DRIVE_KEY,
    Allocation,
    Drive,
    add_macs,
    allocate_disks,
    boot_order,
    check_drives,
    next_disk_index,
    validate_ssh_keys,
)
from ..errors import DieError, ParamError
from ..formats import BOOL, VMID_P, VOLUME_ID, verify_configid_list
from ..guest_config import (
    LXC_DIR,
    QEMU_DIR,
    GuestConfig,
    config_keys,
    config_update,
    guest_ids,
    guest_path,
    load_guest,
    parse_guest_config,
    pending_deletes,
    typed_values,
    write_guest_config,
)
from ..guest_schema import QEMU_FAST_PLUG, QEMU_INDEXED, QEMU_KEYS, qemu_extra
from ..hookscript import check_hookscript
from ..hypervisor import IDLE_COUNTERS, is_running, qemu_running_pid
from ..jsonschema import P, parse_boolean
from ..permissions import (
    QEMU_CONFIG_PRIVS,
    assert_tag_permissions,
    check_qemu_create_perms,
    check_qemu_device_perms,
    check_qemu_update_perms,
    check_root_params,
    log_api_write,
    unique_tags,
)
from ..pmxcfs import locked, read_bytes, text_or_none, write_atomic
from ..rest import VMS, Call, Endpoint, Json
from ..sectionconfig import REPLICATION_CFG, replication_jobs
from ..storage import parse_volume, storage_state
from ..tasks import print_line, run_task
from .nodes_storage import list_images


def create_qemu(call: Call) -> Json:
    settings = call.settings
    vmid = str(call.params["vmid"])
    call.path_params["vmid"] = vmid
    if "sshkeys" in call.params:
        validate_ssh_keys(call.params["sshkeys"])
    check_qemu_create_perms(call, vmid, config_keys(call.params))
    if "tags" in call.params:
        assert_tag_permissions(call, vmid, None, call.params["tags"])
    check_drives(settings, config_keys(call.params))
    with locked(settings):
        for kind, folder in (("VM", QEMU_DIR), ("CT", LXC_DIR)):
            if settings.path(f"{folder}/{vmid}.conf").exists():
                raise DieError(
                    f"unable to create VM {vmid} - {kind} {vmid} already exists on node '{settings.node}'\n"
                )
        path = guest_path(call, "qemu")
        write_atomic(path, "lock: create\n")
    log_api_write(call, "POST", f"/nodes/{call.path_params['node']}/qemu", config_keys(call.params), [])

    def worker(emit: Callable[[str], None]) -> None:
        conf = config_keys(call.params)
        allocation = Allocation(vmid, 0)
        try:
            allocate_disks(settings, conf, {}, emit, allocation)
        except DieError as error:
            allocation.free()
            path.unlink()
            raise DieError(f"unable to create VM {vmid} - {error.text}") from None
        add_macs(vmid, conf)
        if "tags" in conf:
            conf["tags"] = unique_tags(conf["tags"])
        conf.setdefault("boot", boot_order(conf))
        conf["meta"] = f"creation-qemu={settings.version},ctime={int(time.time())}"
        conf["smbios1"] = f"uuid={uuid.uuid4()}"
        conf["vmgenid"] = str(uuid.uuid4())
        with locked(settings):
            write_atomic(path, write_guest_config(GuestConfig(conf, {}, [], ""), "[PENDING]"))

    return run_task(call, "qmcreate", vmid, worker)


def destroy_qemu(call: Call) -> Json:
    """API2/Qemu.pm destroy_vm (task `qmdestroy`): the VM must exist, be unprotected and stopped, and
    without `purge` be no HA resource (resources.cfg) and in no replication job (replication.cfg; checked
    before the task and again in it); the task refuses a locked VM without `skiplock` (`VM is locked
    (<lock>)`: QemuServer::destroy_vm's check_lock), frees every volume its config (and pending section)
    names that it owns (not cdroms; its cloud-init drive is freed), with `destroy-unreferenced-disks` also
    every `vm-<vmid>-*` volume of an enabled storage, then removes the config. `skiplock` is root@pam's
    only (`Only root may use this option.`)."""
    settings = call.settings
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock",))

    def early_checks() -> GuestConfig:
        conf = load_guest(call, "qemu")
        if parse_boolean(conf.main.get("protection", "0")):
            raise DieError(f"can't remove VM {vmid} - protection mode enabled\n")
        if not call.params.get("purge"):
            if f"vm:{vmid}" in ha.parse_resources(text_or_none(settings.path(ha.RESOURCES_CFG)) or ""):
                raise DieError(
                    f"unable to remove VM {vmid} - used in HA resources and purge parameter not set.\n"
                )
            for job in replication_jobs(text_or_none(settings.path(REPLICATION_CFG)) or ""):
                if job.split("-")[0] == vmid:
                    raise DieError(
                        f"There is a replication job '{job}' for guest '{vmid}' - Please remove that first.\n"
                    )
        if is_running(call):
            raise DieError(f"VM {vmid} is running - destroy failed\n")
        return conf

    early_checks()

    def worker(emit: Callable[[str], None]) -> None:
        with locked(settings):
            conf = early_checks()
            if "lock" in conf.main and not call.params.get("skiplock"):
                raise DieError(f"VM is locked ({conf.main['lock']})\n")
            for values in (conf.main, conf.pending):
                for key in [k for k in values if DRIVE_KEY.fullmatch(k) or re.fullmatch(r"unused\d+", k)]:
                    drive = Drive.parse(values[key])
                    if (drive.is_cdrom and not drive.is_cloudinit) or not VOLUME_ID.fullmatch(drive.file):
                        continue
                    volume = parse_volume(settings, drive.file)
                    if volume.vmid == vmid:
                        settings.path(volume.file).unlink(missing_ok=True)
            if call.params.get("destroy-unreferenced-disks"):
                for storage in storage_state(settings)[0]:
                    if parse_boolean(storage.options.get("disable", "0")) or "images" not in storage.content:
                        continue
                    for image in list_images(settings, storage, vmid):
                        settings.path(parse_volume(settings, image["volid"]).file).unlink(missing_ok=True)
            if call.params.get("purge"):
                emit(f"purging VM {vmid} from related configurations..")
            guest_path(call, "qemu").unlink()

    return run_task(call, "qmdestroy", vmid, worker)


def get_qemu_config(call: Call) -> Json:
    if "snapshot" in call.params and call.params.get("current"):
        message = "cannot use 'snapshot' parameter with 'current'"
        raise ParamError({"snapshot": message, "current": message})
    conf = load_guest(call, "qemu")
    values = dict(conf.main)
    if not call.params.get("current"):
        values.update({k: v for k, v in conf.pending.items() if k != "delete"})
        for key in pending_deletes(conf):
            values.pop(key, None)
    if "cipassword" in values:
        values["cipassword"] = "**********"
    return {**typed_values(values, QEMU_KEYS, QEMU_INDEXED), "digest": conf.digest}


def update_qemu_config(call: Call) -> Json:  # noqa: PLR0912, PLR0915
    settings = call.settings
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock",))
    if "sshkeys" in call.params:
        validate_ssh_keys(call.params["sshkeys"])
    changes, deletes = config_update(call, qemu_extra)
    if "hookscript" in changes:
        try:
            check_hookscript(settings, changes["hookscript"])
        except DieError as error:
            raise ParamError({"hookscript": error.text.rstrip("\n")}) from None
    for key in deletes:
        if key in changes:
            raise ParamError({"delete": f"you can't use '-{key}' and -delete {key}' at the same time"})
    check_drives(settings, changes)
    check_qemu_update_perms(call, vmid, changes, deletes)
    with locked(settings):
        conf = load_guest(call, "qemu")
        if "digest" in call.params and call.params["digest"] != conf.digest:
            raise DieError("checksum mismatch (file change by other user?)\n")
        if "lock" in conf.main and not call.params.get("skiplock"):
            raise DieError(f"VM is locked ({conf.main['lock']})\n")
        check_qemu_device_perms(call, vmid, conf, changes, deletes)
        if "tags" in changes or "tags" in deletes:
            old_tags = conf.pending.get("tags", conf.main.get("tags"))
            assert_tag_permissions(call, vmid, old_tags, changes.get("tags"))
            if "tags" in changes:
                changes["tags"] = unique_tags(changes["tags"])
        log_api_write(call, "PUT", f"/nodes/{call.path_params['node']}/qemu/{vmid}/config", changes, deletes)
        shown = {**changes, **({"delete": ",".join(deletes)} if deletes else {})}
        shown.update({"cipassword": "<hidden>"} if "cipassword" in shown else {})
        sys.stdout.write(f"update VM {vmid}: " + " ".join(f"-{k} {shown[k]}" for k in sorted(shown)) + "\n")
        # As qemu-server's update: disks are allocated (or imported), a new NIC gets a MAC.
        allocation = Allocation(vmid, next_disk_index(conf))
        try:
            allocate_disks(settings, changes, {**conf.main, **conf.pending}, print_line, allocation)
        except DieError:
            allocation.free()
            raise
        add_macs(vmid, changes)
        running = is_running(call)
        for key in deletes:
            if key not in conf.main and key not in conf.pending:
                sys.stderr.write(f"cannot delete '{key}' - not set in current configuration!\n")
            elif running and key not in QEMU_FAST_PLUG:
                pending = [k for k in pending_deletes(conf) if k != key]
                conf.pending["delete"] = ",".join(sorted([*pending, key]))
            else:
                conf.main.pop(key, None)
                conf.pending.pop(key, None)
        for key, value in changes.items():
            if running and key not in QEMU_FAST_PLUG:
                if conf.main.get(key) == value:
                    conf.pending.pop(key, None)
                else:
                    conf.pending[key] = value
            else:
                conf.main[key] = value
                conf.pending.pop(key, None)
        if conf.pending.get("delete") == "":
            del conf.pending["delete"]
        write_atomic(guest_path(call, "qemu"), write_guest_config(conf, "[PENDING]"))
    return None


def list_qemu(call: Call) -> Json:
    """qemu-server API2/Qemu.pm `vmlist` (PVE::QemuServer::vmstatus without `full`): only the VMs the user
    has VM.Audit on; `status` from the pidfile check (`qemu_running_pid`)."""
    rpcenv, result = call.rpcenv, []
    for vmid in guest_ids(call.settings, QEMU_DIR):
        if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Audit",), noerr=True):
            continue
        values = parse_guest_config(
            read_bytes(call.settings.path(f"{QEMU_DIR}/{vmid}.conf")), "[PENDING]"
        ).main
        pid = qemu_running_pid(call.settings, str(vmid))
        memory = re.match(r"(?:current=)?(\d+)", values.get("memory", "512"))
        entry: dict[str, Any] = {
            "vmid": vmid,
            "status": "running" if pid is not None else "stopped",
            "name": values.get("name", f"VM {vmid}"),
            "cpus": int(values.get("cores", "1")) * int(values.get("sockets", "1")),
            "maxmem": int(memory.group(1) if memory else 512) * 1024 * 1024,
            **IDLE_COUNTERS,
        }
        if pid is not None:
            entry["pid"] = pid
        entry.update({key: values[key] for key in ("lock", "tags") if key in values})
        result.append(entry)
    return result


QEMU_UPDATE_P = {
    "delete": P(verify=verify_configid_list, list_format=True),
    "revert": P(verify=verify_configid_list, list_format=True),
    "force": BOOL,
    "digest": P(max_length=40),
    "skiplock": BOOL,
}


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"nodes/(?P<node>[^/]+)/qemu", Endpoint("GET", {"full": BOOL}, list_qemu)),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/qemu",
        Endpoint(
            "POST",
            {"vmid": VMID_P},
            create_qemu,
            extra=qemu_extra,
        ),
    ),
    (
        "delete",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)",
        Endpoint(
            "DELETE",
            {"skiplock": BOOL, "purge": BOOL, "destroy-unreferenced-disks": BOOL},
            destroy_qemu,
        ),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/config",
        Endpoint("GET", {"current": BOOL, "snapshot": P()}, get_qemu_config),
    ),
    (
        "set",
        r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/config",
        Endpoint("PUT", QEMU_UPDATE_P, update_qemu_config, True, extra=qemu_extra),
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/nodes/{node}/qemu"): access.ALL_USERS,  # filtered by VM.Audit inside,
    ("POST", "/nodes/{node}/qemu"): access.ALL_USERS,
    ("DELETE", "/nodes/{node}/qemu/{vmid}"): access.Perm(VMS, ("VM.Allocate",)),
    ("GET", "/nodes/{node}/qemu/{vmid}/config"): access.Perm(VMS, ("VM.Audit",)),
    ("PUT", "/nodes/{node}/qemu/{vmid}/config"): access.Perm(VMS, QEMU_CONFIG_PRIVS, any=True),
}
