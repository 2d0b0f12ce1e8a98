"""`/nodes/{node}/lxc[/{vmid}/...]` (pve-container API2/LXC.pm, API2/LXC/Config.pm and Status.pm)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from .. import access
from ..ct_permissions import check_ct_modify_config_perm, check_lxc_create_perms
from ..drives import guest_mac
from ..errors import DieError, ParamError
from ..formats import BOOL, DEV_FMT, MP_FMT, VMID_P, mountpoint_type
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
from ..guest_schema import LXC_INDEXED, LXC_KEYS, lxc_extra
from ..hypervisor import IDLE_COUNTERS, hypervisor_request, lxc_running_path
from ..jsonschema import P, parse_boolean, parse_property_string
from ..permissions import (
    LXC_CONFIG_PRIVS,
    assert_tag_permissions,
    check_root_params,
    log_api_write,
    unique_tags,
)
from ..pmxcfs import locked, read_bytes, write_atomic
from ..rest import VMS, Call, Endpoint, Json
from ..storage import storage_config
from ..sysfs import check_device
from ..tasks import run_task
from .nodes_qemu import QEMU_UPDATE_P


def get_lxc_config(call: Call) -> Json:
    conf = load_guest(call, "lxc")
    values = dict(conf.main)
    if not call.params.get("current"):
        values.update({k: v for k, v in conf.pending.items() if k != "delete"})
        for key in pending_deletes(conf):
            values.pop(key, None)
    result = {**typed_values(values, LXC_KEYS, LXC_INDEXED), "digest": conf.digest}
    if conf.raw_lxc:
        result["lxc"] = [[k, v] for k, v in conf.raw_lxc]
    return result


def update_lxc_config(call: Call) -> Json:
    changes, deletes = config_update(call, lxc_extra)
    with locked(call.settings):
        conf = load_guest(call, "lxc")
        if "digest" in call.params and call.params["digest"] != conf.digest:
            raise DieError("detected modified configuration - file changed by other user? Try again.\n")
        if "lock" in conf.main:
            raise DieError(f"CT is locked ({conf.main['lock']})\n")
        unprivileged = bool(parse_boolean(conf.main.get("unprivileged", "0")))
        check_ct_modify_config_perm(call, call.path_params["vmid"], {}, deletes, unprivileged)
        check_ct_modify_config_perm(call, call.path_params["vmid"], changes, [], unprivileged)
        if "tags" in changes or "tags" in deletes:
            assert_tag_permissions(call, call.path_params["vmid"], conf.main.get("tags"), changes.get("tags"))
            if "tags" in changes:
                changes["tags"] = unique_tags(changes["tags"])
        where = f"/nodes/{call.path_params['node']}/lxc/{call.path_params['vmid']}/config"
        log_api_write(call, "PUT", where, changes, deletes)
        if "unprivileged" in changes:
            raise DieError("unable to modify read-only option: 'unprivileged'\n")
        for key, value in changes.items():
            if re.fullmatch(r"dev\d+", key):
                check_device(call.settings, value)
            conf.main[key] = value
        for key in deletes:
            conf.main.pop(key, None)
        write_atomic(guest_path(call, "lxc"), write_guest_config(conf, "[pve:pending]"))
    return None


def create_lxc(call: Call) -> Json:
    """`vzcreate` (§6.1): vmid free, `ostemplate` required, `rootfs <storage>:<GiB>` allocated, `devN`
    checked against the node's device nodes, `net0` normalised; the template is not unpacked (stand-in)."""
    settings = call.settings
    vmid = str(call.params["vmid"])
    call.path_params["vmid"] = vmid
    if "ostemplate" not in call.params:
        raise ParamError({"ostemplate": "property is missing and it is not optional"})
    check_lxc_create_perms(call, vmid, config_keys(call.params))
    if "tags" in call.params:
        assert_tag_permissions(call, vmid, None, call.params["tags"])
    with locked(settings):
        for kind, folder in (("VM", QEMU_DIR), ("CT", LXC_DIR)):
            if settings.path(f"{folder}/{vmid}.conf").exists():
                raise DieError(f"{kind} {vmid} already exists on node '{settings.node}'\n")
        path = guest_path(call, "lxc")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, "lock: create\n")
    log_api_write(call, "POST", f"/nodes/{call.path_params['node']}/lxc", config_keys(call.params), [])

    def worker(emit: Callable[[str], None]) -> None:
        conf = config_keys(call.params)
        template = conf.pop("ostemplate")
        # Proxmox writes them to the root's authorized_keys, not the config; the lab's container host
        # already has the lab's key.
        conf.pop("ssh-public-keys", None)
        try:
            match = re.fullmatch(r"([a-zA-Z][\w\-.]*):(\d+)", conf.get("rootfs", "local:4"))
            if not match:
                raise DieError(f"storage '{conf.get('rootfs', '').split(':')[0]}' does not exist\n")
            storage_config(settings, match.group(1))
            for key, value in conf.items():
                if re.fullmatch(r"dev\d+", key):
                    check_device(settings, value)
        except DieError as error:
            path.unlink()
            raise DieError(f"unable to create CT {vmid} - {error.text}") from None
        conf["rootfs"] = f"{match.group(1)}:vm-{vmid}-disk-0,size={match.group(2)}G"
        conf.setdefault("unprivileged", "1")
        if "tags" in conf:
            conf["tags"] = unique_tags(conf["tags"])
        conf["arch"] = "amd64"
        conf["ostype"] = "debian"
        for key in [k for k in conf if re.fullmatch(r"net\d+", k)]:
            fields = dict(part.split("=", 1) for part in conf[key].split(","))
            fields.setdefault("hwaddr", guest_mac(vmid, key))
            fields.setdefault("type", "veth")
            order = ["name", "bridge", "hwaddr", "ip", "type"]
            conf[key] = ",".join(
                f"{k}={fields[k]}" for k in [*order, *sorted(set(fields) - set(order))] if k in fields
            )
        emit(f"extracting archive '{template}' (LAB STAND-IN: not unpacked)")
        emit("Detected container architecture: amd64")
        with locked(settings):
            write_atomic(path, write_guest_config(GuestConfig(conf, {}, [], ""), "[pve:pending]"))

    return run_task(call, "vzcreate", vmid, worker)


def get_lxc_status(call: Call) -> Json:
    conf = load_guest(call, "lxc")
    running = lxc_running_path(call).is_file()
    vmid = int(call.path_params["vmid"])
    return {
        "vmid": vmid,
        "type": "lxc",
        "status": "running" if running else "stopped",
        "name": conf.main.get("hostname", f"CT{vmid}"),
        "cpus": int(conf.main.get("cores", "1")),
        "maxmem": int(conf.main.get("memory", "512")) * 1024 * 1024,
        "maxswap": int(conf.main.get("swap", "512")) * 1024 * 1024,
        "swap": 0,
        **IDLE_COUNTERS,
    }


def _dev_entries(conf: dict[str, str]) -> list[dict[str, str]]:
    """The `devN` entries of a CT config, in index order, as property dicts (path, gid, uid, mode, ...)."""
    keys = sorted((k for k in conf if re.fullmatch(r"dev\d+", k)), key=lambda k: int(k[3:]))
    return [parse_property_string(P(props=DEV_FMT, default_key="path"), conf[k]) for k in keys]


def _mp_keys(conf: dict[str, str]) -> list[str]:
    return sorted((k for k in conf if re.fullmatch(r"mp\d+", k)), key=lambda k: int(k[2:]))


def mp_entries(conf: dict[str, str]) -> list[dict[str, Any]]:
    """The bind mount points of a CT config (an `mpN` whose volume is a node directory: LXC/Config.pm
    classify_mountpoint's `bind`), in index order, as the lab hypervisor takes them: `{"key": "mp0",
    "source": <the node's directory>, "target": <the path in the container>, "ro": <bool>}`."""
    entries: list[dict[str, Any]] = []
    for key in _mp_keys(conf):
        props = parse_property_string(P(props=MP_FMT, default_key="volume"), conf[key])
        if mountpoint_type(props.get("volume", "")) != "bind":
            continue  # a storage volume or a device: not modelled (lab/pve/container.py)
        entries.append(
            {
                "key": key,
                "source": props["volume"],
                "target": props["mp"],
                "ro": bool(parse_boolean(props.get("ro", "0"))),
            }
        )
    return entries


def _check_bind_mounts(call: Call, vmid: str, conf: dict[str, str]) -> None:
    """The pre-start hook's mount of each bind mpN (LXC.pm mount_volume: `directory '<dir>' does not exist`,
    written to the CT's /run/pve/ct-<vmid>.stderr log); the start task then fails as vm_start's run_command of
    `systemctl start pve-container@<vmid>` does."""
    for key in _mp_keys(conf):
        volume = parse_property_string(P(props=MP_FMT, default_key="volume"), conf[key]).get("volume", "")
        if mountpoint_type(volume) == "bind" and not call.settings.path(volume).is_dir():
            write_atomic(
                call.settings.path(f"/run/pve/ct-{vmid}.stderr"), f"directory '{volume}' does not exist\n"
            )
            raise DieError(f"command 'systemctl start pve-container@{vmid}' failed: exit code 1\n")


def start_lxc(call: Call) -> Json:
    """`vzstart` (§6.4): `CT <vmid> already running` before the fork; devN checked again at start, and a
    bind mpN's directory (_check_bind_mounts). The lab hypervisor starts the container lab host with those
    device nodes and bind mounts (`mp_entries`; lab/pve/container.py mounts them); its refusal fails the task
    with `start failed: <message>`. The stand-in records the container as running (its status)."""
    vmid = call.path_params["vmid"]
    check_root_params(call, ("skiplock",))
    conf = load_guest(call, "lxc")
    if lxc_running_path(call).is_file():
        raise DieError(f"CT {vmid} already running\n")

    def worker(_emit: Callable[[str], None]) -> None:
        if "lock" in conf.main and not call.params.get("skiplock"):
            raise DieError(f"CT is locked ({conf.main['lock']})\n")
        for key, value in conf.main.items():
            if re.fullmatch(r"dev\d+", key):
                check_device(call.settings, value)
        _check_bind_mounts(call, vmid, conf.main)
        request = {
            "action": "start",
            "type": "lxc",
            "vmid": int(vmid),
            "dev": _dev_entries(conf.main),
            "mp": mp_entries(conf.main),
        }
        hypervisor_request(call, request)
        running = lxc_running_path(call)
        running.parent.mkdir(parents=True, exist_ok=True)
        running.write_text(f"{int(time.time())}\n")

    return run_task(call, "vzstart", vmid, worker)


def stop_lxc(call: Call, task_type: str = "vzstop") -> Json:
    """`vzstop` (§6.4), and pve-container API2/LXC/Status.pm `vm_shutdown` (`vzshutdown`): `CT <vmid> not
    running` before the fork. The stand-in's container has no init to ask, so a shutdown ends it at once."""
    vmid = call.path_params["vmid"]
    if task_type == "vzstop":
        check_root_params(call, ("skiplock",))
    load_guest(call, "lxc")
    if not lxc_running_path(call).is_file():
        raise DieError(f"CT {vmid} not running\n")

    def worker(_emit: Callable[[str], None]) -> None:
        hypervisor_request(call, {"action": "stop", "type": "lxc", "vmid": int(vmid)})
        lxc_running_path(call).unlink(missing_ok=True)

    return run_task(call, task_type, vmid, worker)


def list_lxc(call: Call) -> Json:
    """pve-container API2/LXC.pm `vmlist` (PVE::LXC::vmstatus): only the CTs the user has VM.Audit on;
    `name` the hostname (`CT<vmid>` without one), `type` lxc."""
    rpcenv, result = call.rpcenv, []
    for vmid in guest_ids(call.settings, LXC_DIR):
        if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Audit",), noerr=True):
            continue
        values = parse_guest_config(
            read_bytes(call.settings.path(f"{LXC_DIR}/{vmid}.conf")), "[pve:pending]"
        ).main
        running = call.settings.path(f"/run/lxc/{vmid}.running").is_file()
        entry: dict[str, Any] = {
            "vmid": vmid,
            "type": "lxc",
            "status": "running" if running else "stopped",
            "name": re.sub(r"\s", "", values.get("hostname", f"CT{vmid}")),
            "cpus": int(values.get("cores", "1")),
            "maxmem": int(values.get("memory", "512")) * 1024 * 1024,
            "maxswap": int(values.get("swap", "0")) * 1024 * 1024,
            "swap": 0,
            **IDLE_COUNTERS,
            "maxdisk": 4 * 1024 * 1024 * 1024,  # vmstatus' default for a stopped CT without a rootfs size
        }
        entry.update({key: values[key] for key in ("lock", "tags") if key in values})
        result.append(entry)
    return result


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"nodes/(?P<node>[^/]+)/lxc", Endpoint("GET", {}, list_lxc)),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/config",
        Endpoint("GET", {"current": BOOL, "snapshot": P()}, get_lxc_config),
    ),
    (
        "set",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/config",
        Endpoint(
            "PUT",
            {k: v for k, v in QEMU_UPDATE_P.items() if k in ("delete", "revert", "digest")},
            update_lxc_config,
            True,
            extra=lxc_extra,
        ),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc",
        Endpoint(
            "POST",
            {"vmid": VMID_P, "ostemplate": P(), "ssh-public-keys": P(max_length=65536)},
            create_lxc,
            extra=lxc_extra,
        ),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/current",
        Endpoint("GET", {}, get_lxc_status),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/start",
        Endpoint("POST", {"skiplock": BOOL, "debug": BOOL}, start_lxc),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/stop",
        Endpoint("POST", {"skiplock": BOOL, "overrule-shutdown": BOOL}, stop_lxc),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/lxc/(?P<vmid>[^/]+)/status/shutdown",
        Endpoint(
            "POST",
            {"timeout": P(type="integer", minimum=0), "forceStop": BOOL},
            lambda call: stop_lxc(call, "vzshutdown"),
        ),
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/nodes/{node}/lxc"): access.ALL_USERS,
    ("POST", "/nodes/{node}/lxc"): access.ALL_USERS,
    ("GET", "/nodes/{node}/lxc/{vmid}/config"): access.Perm(VMS, ("VM.Audit",)),
    ("PUT", "/nodes/{node}/lxc/{vmid}/config"): access.Perm(VMS, LXC_CONFIG_PRIVS, any=True),
    ("GET", "/nodes/{node}/lxc/{vmid}/status/current"): access.Perm(VMS, ("VM.Audit",)),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/start"): access.Perm(VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/stop"): access.Perm(VMS, ("VM.PowerMgmt",)),
    ("POST", "/nodes/{node}/lxc/{vmid}/status/shutdown"): access.Perm(VMS, ("VM.PowerMgmt",)),
}
