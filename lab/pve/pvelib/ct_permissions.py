"""pve-container's permission checks inside its handlers (LXC.pm check_ct_modify_config_perm, API2/LXC.pm
create_vm's); the checks it shares with qemu-server's (volumes, bridges) are permissions.py's."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import access
from .errors import DieError
from .formats import MP_FMT, mountpoint_type
from .jsonschema import P, parse_boolean, parse_property_string
from .permissions import check_bridge_access, check_volume_access

if TYPE_CHECKING:
    from .rest import Call


def _mountpoint_volume(value: str) -> str:
    """LXC/Config.pm parse_volume's `volume` (the default key) of a rootfs or mpN value."""
    try:
        return parse_property_string(P(props=MP_FMT, default_key="volume"), value).get("volume", "")
    except ValueError as error:
        raise DieError(str(error)) from None


def check_ct_modify_config_perm(  # noqa: PLR0912 (one branch per key kind, as upstream)
    call: Call, vmid: str, changes: dict[str, str], deletes: list[str], unprivileged: bool
) -> None:
    """pve-container LXC.pm check_ct_modify_config_perm (keys set, then deleted): devN, hookscript and a
    privileged CT's features are root@pam's only (`Permission check failed (<why>)`), and so is a rootfs/mpN
    that is no storage volume (a host directory's bind mount, a /dev/ device: `mount point type bind is only
    allowed for root@pam`); a volume needs storage access; every other key its VM.Config.* privilege."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    user = rpcenv.user
    for key, deleting in [*((k, False) for k in sorted(changes)), *((k, True) for k in deletes)]:
        if key in ("cores", "cpuunits", "cpulimit"):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.CPU",))
        elif key == "rootfs" or re.fullmatch(r"mp\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Disk",))
            if not deleting:
                volid = _mountpoint_volume(changes[key])
                if mountpoint_type(volid) != "volume":
                    raise access.PermissionDenied(
                        f"mount point type {mountpoint_type(volid)} is only allowed for root@pam"
                    )
                if new := re.fullmatch(r"([^:\s]+):(\d+(\.\d+)?)", volid):
                    rpcenv.check(user, f"/storage/{new.group(1)}", ("Datastore.AllocateSpace",))
                else:
                    check_volume_access(call, volid, vmid, "rootdir")
        elif key in ("memory", "swap"):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Memory",))
        elif re.fullmatch(r"net\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Network",))
            if not deleting:
                check_bridge_access(rpcenv, {key: changes[key]})
        elif re.fullmatch(r"dev\d+", key):
            raise access.PermissionDenied("configuring device passthrough is only allowed for root@pam")
        elif key in ("nameserver", "searchdomain", "hostname"):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Network",))
        elif key == "features":
            if not unprivileged:
                raise access.PermissionDenied(
                    "changing feature flags for privileged container is only allowed for root@pam"
                )
            features = {f.partition("=")[0] for f in changes.get(key, "").split(",") if f}
            if features - {"nesting"}:
                raise access.PermissionDenied(
                    "changing feature flags (except nesting) is only allowed for root@pam"
                )
            rpcenv.check_vm_perm(user, vmid, ("VM.Allocate",))
        elif key == "hookscript":
            raise access.PermissionDenied("changing the hookscript is only allowed for root@pam")
        elif key != "tags":
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Options",))


def check_lxc_create_perms(call: Call, vmid: str, conf: dict[str, str]) -> None:
    """API2/LXC.pm create_vm's checks, in its order: Sys.Modify on / for a privileged CT, VM.Allocate on
    /vms/<vmid> (a bare `Permission check failed` without), each key, then the template's access."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    unprivileged = bool(parse_boolean(conf.get("unprivileged", "1")))
    if not unprivileged:
        rpcenv.check(rpcenv.user, "/", ("Sys.Modify",))
    if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Allocate",), noerr=True):
        raise access.PermissionDenied()
    keys = {k: v for k, v in conf.items() if k not in ("ostemplate", "ssh-public-keys")}
    check_ct_modify_config_perm(call, vmid, keys, [], unprivileged)
    check_volume_access(call, conf["ostemplate"], vmid, "vztmpl")
