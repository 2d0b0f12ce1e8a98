"""The permission checks Proxmox makes inside its handlers (qemu-server's check_vm_modify_config_perm and
its device checks: hostpciN, virtiofsN, serialN; tags, bridges, volumes, which pve-container's checks in
ct_permissions.py share) and the lab's record of API writes."""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING

from . import access
from .drives import NEW_DISK, Drive, drive_keys
from .errors import DieError, ParamError
from .formats import HOSTPCI_FMT, VIRTIOFS_FMT, VOLUME_ID
from .guest_config import LXC_DIR, QEMU_DIR, GuestConfig, parse_guest_config
from .guest_schema import DRIVE_NAMES
from .jsonschema import P, parse_property_string
from .storage import parse_volume

if TYPE_CHECKING:
    from .rest import Call
    from .settings import Settings

ROOT_ONLY_OPTION = "Only root may use this option."


API_WRITES_LOG = "/var/log/pvegpu-lab/api-writes.log"  # the lab's record: who set which config keys


# API2/Qemu.pm: the option lists of $check_vm_modify_config_perm; every other key is root@pam's only.
QEMU_CPU_OPTIONS = {"cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus"}


QEMU_MEMORY_OPTIONS = {"memory", "balloon", "shares", "allow-ksm"}


QEMU_HWTYPE_OPTIONS = {
    *("acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga"),
    *("watchdog", "audio0", "rng0"),
}


QEMU_GENERAL_OPTIONS = {
    *("agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime"),
    *("migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf"),
    "template",
}


QEMU_DISK_OPTIONS = {"boot", "bootdisk", "vmstatestorage"}


QEMU_CLOUDINIT_OPTIONS = {
    *("cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys"),
}


# API2/Qemu.pm $vm_config_perm_list, API2/LXC/Config.pm's: the update endpoints' clauses (any of them).
QEMU_CONFIG_PRIVS = (
    *("VM.Config.Disk", "VM.Config.CDROM", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network"),
    *("VM.Config.HWType", "VM.Config.Options", "VM.Config.Cloudinit"),
)


LXC_CONFIG_PRIVS = (
    *("VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options"),
)


def check_root_params(call: Call, names: tuple[str, ...]) -> None:
    """`skiplock`, `keepActive`, ...: `<name>: Only root may use this option.` (400) for anyone else."""
    if call.rpcenv.is_root:
        return
    for name in names:
        if call.params.get(name):
            raise ParamError({name: ROOT_ONLY_OPTION})


def check_vm_modify_config_perm(  # noqa: PLR0912 (one branch per option list, as upstream)
    rpcenv: access.RpcEnv, vmid: str, keys: list[str]
) -> None:
    """API2/Qemu.pm $check_vm_modify_config_perm: the privilege each key needs on /vms/<vmid>; drives,
    serialN, usbN, hostpciN, virtiofsN and unusedN are checked elsewhere (by value); any key outside the
    lists (args, hookscript, hugepages, affinity, lock, ...) dies `only root can set '<key>' config`."""
    if rpcenv.is_root:
        return
    user = rpcenv.user
    for key in keys:
        if key in DRIVE_NAMES or key in ("cdrom", "tags"):
            continue
        if re.fullmatch(r"(?:unused|serial|usb|hostpci|virtiofs)\d+", key):
            continue
        if key in QEMU_CPU_OPTIONS or re.fullmatch(r"numa\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.CPU",))
        elif key in QEMU_MEMORY_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Memory",))
        elif key in QEMU_HWTYPE_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.HWType",))
        elif key in QEMU_GENERAL_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Options",))
            if key == "startup":
                rpcenv.check_full(user, "/", ("Sys.Modify",))
        elif key == "freeze":
            rpcenv.check_vm_perm(user, vmid, ("VM.PowerMgmt",))
        elif key in QEMU_DISK_OPTIONS:
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Disk",))
        elif re.fullmatch(r"net\d+", key) or key == "running-nets-host-mtu":
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Network",))
        elif key in QEMU_CLOUDINIT_OPTIONS or re.fullmatch(r"ipconfig\d+", key):
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Cloudinit", "VM.Config.Network"), any_of=True)
        elif key == "vmstate":
            rpcenv.check_vm_perm(user, vmid, ("VM.Config.Disk", "VM.PowerMgmt"))
        else:
            raise DieError(f"only root can set '{key}' config\n")


DATACENTER_CFG = "/etc/pve/datacenter.cfg"


def split_tags(text: str | None) -> list[str]:
    """PVE::Tools::split_list: a tag list split on `;`, `,`, spaces (and NUL)."""
    return [tag for tag in re.split(r"[;,\s\0]+", text or "") if tag]


def unique_tags(text: str) -> str:
    """GuestHelpers.pm get_unique_tags with the default tag-style: lowercased, deduplicated, sorted, `;`."""
    return ";".join(sorted({tag.lower() for tag in split_tags(text)}))


def _datacenter(settings: Settings) -> dict[str, str]:
    path = settings.path(DATACENTER_CFG)
    text = path.read_text() if path.exists() else ""
    found = (re.fullmatch(r"([a-z][a-z0-9-]*):\s*(.*?)\s*", line) for line in text.splitlines())
    return {match.group(1): match.group(2) for match in found if match}


def _guest_tags(settings: Settings, rpcenv: access.RpcEnv, privileged: bool) -> set[str]:
    """get_allowed_tags' `existing` set: the tags of every guest the user may audit (all, privileged)."""
    tags: set[str] = set()
    for folder in (QEMU_DIR, LXC_DIR):
        directory = settings.path(folder)
        for conf in sorted(directory.glob("*.conf")) if directory.exists() else []:
            if not privileged and not rpcenv.check_vm_perm(rpcenv.user, conf.stem, ("VM.Audit",), noerr=True):
                continue
            values = parse_guest_config(conf.read_bytes(), "[PENDING]").main
            tags.update(split_tags(values.get("tags")))
    return tags


def assert_tag_permissions(call: Call, vmid: str, old: str | None, new: str | None) -> None:
    """GuestHelpers.pm assert_tag_permissions: VM.Config.Options on the guest; each tag added or removed
    must be allowed by datacenter `user-tag-access` (`user-allow` free (default) | existing | list | none,
    `user-allow-list`) and not a `registered-tags` one, unless the user has Sys.Modify on `/`:
    `Permission check failed (/, Sys.Modify for modifying tag '<tag>')`."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    rpcenv.check_vm_perm(rpcenv.user, vmid, ("VM.Config.Options",))
    if rpcenv.check(rpcenv.user, "/", ("Sys.Modify",), noerr=True):
        return
    config = _datacenter(call.settings)
    access_opts = dict(
        part.split("=", 1) for part in config.get("user-tag-access", "").split(",") if "=" in part
    )
    user_allow = access_opts.get("user-allow", "free")
    privileged_tags = set(split_tags(config.get("registered-tags")))
    allowed = set(split_tags(access_opts.get("user-allow-list"))) if user_allow != "none" else set()
    if user_allow in ("free", "existing"):
        allowed |= _guest_tags(call.settings, rpcenv, privileged=False)
    allowed -= privileged_tags
    before, after = split_tags(old), split_tags(new)
    for tag in sorted(set(before) | set(after)):
        if before.count(tag) == after.count(tag):
            continue
        if (tag not in allowed and user_allow != "free") or tag in privileged_tags:
            raise access.PermissionDenied(f"/, Sys.Modify for modifying tag '{tag}'")


def check_hostpci_perm(rpcenv: access.RpcEnv, vmid: str, key: str, value: str) -> None:
    """API2/Qemu.pm check_hostpci_perm: `host=` is root@pam's only; `mapping=` needs Mapping.Use on
    /mapping/pci/<id> and VM.Config.HWType; `romfile` is root@pam's only (400)."""
    if rpcenv.is_root:
        return
    device = parse_property_string(P(props=HOSTPCI_FMT, default_key="host"), value)
    if "host" in device:
        raise DieError(f"only root can set '{key}' config for non-mapped devices\n")
    if "mapping" in device:
        rpcenv.check_full(rpcenv.user, f"/mapping/pci/{device['mapping']}", ("Mapping.Use",))
        rpcenv.check_vm_perm(rpcenv.user, vmid, ("VM.Config.HWType",))
    else:
        raise DieError("either 'host' or 'mapping' must be set.\n")
    if "romfile" in device:
        raise ParamError({key: "only root@pam can set 'romfile' option"})


def check_dir_perm(rpcenv: access.RpcEnv, vmid: str, value: str) -> None:
    """API2/Qemu.pm check_dir_perm (a virtiofsN set, replaced or deleted): VM.Config.Disk on the VM, then
    Mapping.Use on /mapping/dir/<dirid>."""
    if rpcenv.is_root:
        return
    rpcenv.check_vm_perm(rpcenv.user, vmid, ("VM.Config.Disk",))
    virtiofs = parse_property_string(P(props=VIRTIOFS_FMT, default_key="dirid"), value)
    rpcenv.check_full(rpcenv.user, f"/mapping/dir/{virtiofs['dirid']}", ("Mapping.Use",))


def _check_serial_perm(rpcenv: access.RpcEnv, vmid: str, key: str, value: str, verb: str) -> None:
    """$check_vm_create_serial_perm and update_vm's serialN branch: a `socket` needs VM.Config.HWType."""
    if rpcenv.is_root:
        return
    if value != "socket":
        raise DieError(f"only root can {verb} '{key}' config for real devices\n")
    rpcenv.check_vm_perm(rpcenv.user, vmid, ("VM.Config.HWType",))


def check_bridge_access(rpcenv: access.RpcEnv, conf: dict[str, str]) -> None:
    """QemuServer.pm check_bridge_access / GuestHelpers.pm check_vnet_access (no SDN: zone
    `localnetwork`): SDN.Use on /sdn/zones/localnetwork/<bridge>[/<tag>]."""
    if rpcenv.is_root:
        return
    for key in sorted(k for k in conf if re.fullmatch(r"net\d+", k)):
        net = dict(part.partition("=")[::2] for part in conf[key].split(",") if "=" in part)
        if "bridge" not in net:
            continue
        path = f"/sdn/zones/localnetwork/{net['bridge']}"
        rpcenv.check(rpcenv.user, f"{path}/{net['tag']}" if net.get("tag") else path, ("SDN.Use",))


def check_volume_access(call: Call, volid: str, vmid: str | None, wanted: str | None = None) -> None:
    """PVE::Storage::check_volume_access: Datastore.Allocate on the storage allows all; an iso, vztmpl or
    import volume needs Datastore.AllocateSpace or Datastore.Audit; one's own disk nothing; another VM's
    disk Datastore.Audit + VM.Config.Disk on its owner; a path is root@pam's only."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    user = rpcenv.user
    if not VOLUME_ID.fullmatch(volid):
        raise DieError("Only root can pass arbitrary filesystem paths.")
    volume = parse_volume(call.settings, volid)
    if wanted is not None and volume.vtype != wanted and (wanted != "rootdir" or volume.vtype != "images"):
        raise DieError(f"unable to use volume {volid} - content type needs to be '{wanted}'\n")
    sid = volume.storage.id
    if rpcenv.check(user, f"/storage/{sid}", ("Datastore.Allocate",), noerr=True):
        return
    if volume.vtype in ("iso", "vztmpl", "import"):
        rpcenv.check_any(user, f"/storage/{sid}", ("Datastore.AllocateSpace", "Datastore.Audit"))
    elif volume.vmid is not None and vmid is not None and volume.vmid == vmid:
        pass
    elif volume.vtype == "backup" and volume.vmid:
        rpcenv.check(user, f"/storage/{sid}", ("Datastore.AllocateSpace",))
        rpcenv.check(user, f"/vms/{volume.vmid}", ("VM.Backup",))
    elif volume.vtype in ("images", "rootdir") and volume.vmid:
        rpcenv.check(user, f"/storage/{sid}", ("Datastore.Audit",))
        rpcenv.check(user, f"/vms/{volume.vmid}", ("VM.Config.Disk",))
    else:
        raise DieError(f"missing privileges to access {volid}\n")


def check_storage_perms(call: Call, vmid: str, changes: dict[str, str]) -> None:
    """API2/Qemu.pm $check_storage_access: a new disk needs Datastore.AllocateSpace on its storage, an
    existing volume check_volume_access, an `import-from` source too (or VM.Clone on its VM); `cdrom`
    (the host's drive) Sys.Console on /."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    for key in drive_keys(changes):
        drive = Drive.parse(changes[key])
        volume = VOLUME_ID.fullmatch(drive.file)
        new = NEW_DISK.fullmatch(drive.file)
        if drive.file in ("", "none", "cloudinit") or (volume and volume.group(2) == "cloudinit"):
            pass
        elif drive.is_cdrom and drive.file == "cdrom":
            rpcenv.check(rpcenv.user, "/", ("Sys.Console",))
        elif not drive.is_cdrom and new:
            rpcenv.check(rpcenv.user, f"/storage/{new.group(2)}", ("Datastore.AllocateSpace",))
        else:
            check_volume_access(call, drive.file, vmid)
        source = drive.options.get("import-from")
        if source is not None:
            owner = parse_volume(call.settings, source).vmid if VOLUME_ID.fullmatch(source) else None
            if owner:
                rpcenv.check(rpcenv.user, f"/vms/{owner}", ("VM.Clone",))
            else:
                check_volume_access(call, source, vmid)


def check_qemu_create_perms(call: Call, vmid: str, conf: dict[str, str]) -> None:
    """API2/Qemu.pm create_vm's checks, in its order: VM.Allocate on /vms/<vmid> (a bare `Permission
    check failed` without), storage access, each key's privilege, serialN, hostpciN, virtiofsN, the
    bridges."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    if not rpcenv.check(rpcenv.user, f"/vms/{vmid}", ("VM.Allocate",), noerr=True):
        raise access.PermissionDenied()
    check_storage_perms(call, vmid, conf)
    check_vm_modify_config_perm(rpcenv, vmid, sorted(conf))
    for key in sorted(k for k in conf if re.fullmatch(r"serial\d+", k)):
        _check_serial_perm(rpcenv, vmid, key, conf[key], "set")
    for key in sorted(k for k in conf if re.fullmatch(r"hostpci\d+", k)):
        check_hostpci_perm(rpcenv, vmid, key, conf[key])
    for key in sorted(k for k in conf if re.fullmatch(r"virtiofs\d+", k)):
        check_dir_perm(rpcenv, vmid, conf[key])
    check_bridge_access(rpcenv, conf)


def check_qemu_update_perms(call: Call, vmid: str, changes: dict[str, str], deletes: list[str]) -> None:
    """API2/Qemu.pm update_vm before the config is loaded: the keys deleted, then the keys set
    ($check_vm_modify_config_perm: deleting a root-only key is root's too), storage, bridges."""
    check_vm_modify_config_perm(call.rpcenv, vmid, deletes)
    check_vm_modify_config_perm(call.rpcenv, vmid, sorted(changes))
    check_storage_perms(call, vmid, changes)
    check_bridge_access(call.rpcenv, changes)


def check_qemu_device_perms(
    call: Call, vmid: str, conf: GuestConfig, changes: dict[str, str], deletes: list[str]
) -> None:
    """update_vm's value-dependent checks on the loaded config: a hostpciN or virtiofsN deleted (its value),
    replaced (old and new value) or set (check_hostpci_perm, check_dir_perm); serialN as `socket` only."""
    rpcenv = call.rpcenv
    if rpcenv.is_root:
        return
    current = {**conf.main, **{k: v for k, v in conf.pending.items() if k != "delete"}}
    for key in deletes:
        if re.fullmatch(r"hostpci\d+", key) and key in current:
            check_hostpci_perm(rpcenv, vmid, key, current[key])
        elif re.fullmatch(r"virtiofs\d", key) and key in current:
            check_dir_perm(rpcenv, vmid, current[key])
        elif re.fullmatch(r"serial\d+", key) and key in current:
            _check_serial_perm(rpcenv, vmid, key, current[key], "delete")
    for key in sorted(changes):
        if re.fullmatch(r"hostpci\d+", key):
            if conf.main.get(key):
                check_hostpci_perm(rpcenv, vmid, key, conf.main[key])
            check_hostpci_perm(rpcenv, vmid, key, changes[key])
        elif re.fullmatch(r"virtiofs\d", key):
            if conf.main.get(key):
                check_dir_perm(rpcenv, vmid, conf.main[key])
            check_dir_perm(rpcenv, vmid, changes[key])
        elif re.fullmatch(r"serial\d+", key):
            old = conf.main.get(key)
            _check_serial_perm(rpcenv, vmid, key, changes[key] if old in (None, "socket") else old, "modify")


def log_api_write(call: Call, method: str, path: str, changes: dict[str, str], deletes: list[str]) -> None:
    """One line per accepted guest config write in the lab's API_WRITES_LOG: `<user> <METHOD> <path>
    <keys>` (keys set, then `-<key>` per key deleted), so that tests can tell which identity set what.
    The record is the lab's, not Proxmox's: a write it cannot make (a full disk, a file size limit) changes
    nothing of the call."""
    keys = ",".join([*sorted(changes), *(f"-{key}" for key in deletes)])
    log = call.settings.path(API_WRITES_LOG)
    with contextlib.suppress(OSError):
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as handle:
            handle.write(f"{call.rpcenv.user} {method} {path} {keys}\n")
