"""What only root@pam may write through Proxmox's API, as Proxmox itself decides it. Pure.

An API token is never root@pam (its user is `<user>@<realm>!<name>`), so a write that carries one of these
keys goes through root's `pvesh` on the node (pvegpu.pve `RootRouted`) or is refused before any host is
touched (pvegpu.inventory.validate). From the upstream checks, which run for the keys set and for the keys
named in `delete` alike:

- qemu-server `src/PVE/API2/Qemu.pm` `$check_vm_modify_config_perm`: a VM config key outside its allowed
  lists (`$cpuoptions`, `$memoryoptions`, `$hwtypeoptions`, `$generaloptions`, `$vmpoweroptions`,
  `$diskoptions`, `$cloudinitoptions`, `numaN`, `netN`, `ipconfigN`, `vmstate`, drives, `unusedN`, `serialN`,
  `usbN`, `hostpciN`, `virtiofsN`, `tags`, `cdrom`) dies `only root can set '<key>' config` (`args`,
  `hookscript`, `hugepages`, `keephugepages`, `affinity`, `lock`, `vmgenid`, ...). Value-dependent:
  `check_hostpci_perm` (`host=`: `only root can set 'hostpciN' config for non-mapped devices`; `romfile`),
  `check_usb_perm` (a `host=` other than `spice`), serial ports other than `socket`.
- `skiplock` (update, destroy, start, stop): `Only root may use this option.`
- pve-container `src/PVE/LXC.pm` `check_ct_modify_config_perm`: `devN` (`configuring device passthrough is
  only allowed for root@pam`), `hookscript`, `features`; value-dependent: a `rootfs` or `mpN` set to
  anything but a storage volume (a node directory's bind mount, a `/dev/` device: `mount point type bind is
  only allowed for root@pam`; deleting one needs VM.Config.Disk only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

ROOT_USER = "root@pam"

# Qemu.pm: the keys another identity may set with a VM.* privilege (the lists named in the docstring).
_VM_ALLOWED = frozenset(
    {
        # $cpuoptions
        "cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus",
        # $memoryoptions
        "memory", "balloon", "shares", "allow-ksm",
        # $hwtypeoptions
        "acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga",
        "watchdog", "audio0", "rng0",
        # $generaloptions
        "agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime",
        "migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf",
        "template",
        # $vmpoweroptions, $diskoptions
        "freeze", "boot", "bootdisk", "vmstatestorage",
        # $cloudinitoptions
        "cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver", "searchdomain", "sshkeys",
        # named in the check itself
        "cdrom", "tags", "vmstate", "running-nets-host-mtu",
    }
)  # fmt: skip
# QemuServer/Drive.pm valid_drive_names (ide0-3, scsi0-30, virtio0-15, sata0-5, efidisk0, tpmstate0), and the
# numbered keys the check passes on (their value-dependent checks are `_vm_value_needs_root`).
_VM_ALLOWED_NUMBERED = re.compile(
    r"ide[0-3]|scsi([12]?[0-9]|30)|virtio(1[0-5]|[0-9])|sata[0-5]|efidisk0|tpmstate0"
    r"|(numa|net|ipconfig|unused|serial|usb|hostpci|virtiofs)[0-9]+"
)
# The parameters of a VM create or config update that are not config keys (extract_param before the check).
_VM_CALL_PARAMS = frozenset(
    {
        "vmid", "node", "archive", "bwlimit", "force", "pool", "start", "ha-managed", "storage", "unique",
        "live-restore", "import-working-storage", "digest", "delete", "revert", "skiplock",
        "background_delay", "skip_cloud_init",
    }
)  # fmt: skip
# pve-container LXC.pm check_ct_modify_config_perm: only root@pam (features: for pvegpu's purposes always).
_CT_ROOT_ONLY = re.compile(r"dev[0-9]+|hookscript|features")
_CT_MOUNT = re.compile(
    r"rootfs|mp[0-9]+"
)  # root@pam's when set to a path (LXC/Config.pm classify_mountpoint)
SKIPLOCK = "skiplock"

_VM_CREATE = re.compile(r"/nodes/[^/]+/qemu")
_VM_CONFIG = re.compile(r"/nodes/[^/]+/qemu/[0-9]+/config")
_CT_CREATE = re.compile(r"/nodes/[^/]+/lxc")
_CT_CONFIG = re.compile(r"/nodes/[^/]+/lxc/[0-9]+/config")
_LIST_SPLIT = re.compile(r"[,;\s]+")  # PVE::Tools::split_list, how Proxmox reads `delete`


def vm_root_only_keys(values: Mapping[str, object], delete: Iterable[str] = ()) -> tuple[str, ...]:
    """The VM config keys among `values` (set) and `delete` (removed) that only root@pam may write, sorted."""
    found = {key for key in delete if not _vm_key_allowed(key)}
    for key, value in values.items():
        if key in _VM_CALL_PARAMS:
            continue
        if not _vm_key_allowed(key) or _vm_value_needs_root(key, value):
            found.add(key)
    return tuple(sorted(found))


def ct_root_only_keys(values: Mapping[str, object], delete: Iterable[str] = ()) -> tuple[str, ...]:
    """The container config keys among `values` and `delete` that only root@pam may write, sorted: a bind or
    device mount point (`mpN`/`rootfs` set to a path) among `values` too."""
    found = {key for key in {*values, *delete} if _CT_ROOT_ONLY.fullmatch(key)}
    found |= {
        key
        for key, value in values.items()
        if _CT_MOUNT.fullmatch(key)
        and _property_string(str(value), "volume").get("volume", "").startswith("/")
    }
    return tuple(sorted(found))


def root_only_params(method: str, path: str, params: Mapping[str, object]) -> tuple[str, ...]:
    """What in one API call only root@pam may send: the root-only config keys of a VM or container create
    (`POST /nodes/<node>/qemu`) or config update (`PUT`/`POST …/config`, `delete` included), and
    `skiplock` on any call. Empty: any identity with the privileges may send it."""
    found: list[str] = [SKIPLOCK] if _truthy(params.get(SKIPLOCK)) else []
    delete = [key for key in _LIST_SPLIT.split(str(params.get("delete") or "")) if key]
    vm = (method == "POST" and _VM_CREATE.fullmatch(path)) or (method != "GET" and _VM_CONFIG.fullmatch(path))
    ct = (method == "POST" and _CT_CREATE.fullmatch(path)) or (method != "GET" and _CT_CONFIG.fullmatch(path))
    if vm:
        found += vm_root_only_keys(params, delete)
    elif ct:
        found += ct_root_only_keys({k: v for k, v in params.items() if k not in _VM_CALL_PARAMS}, delete)
    return tuple(dict.fromkeys(found))


def _vm_key_allowed(key: str) -> bool:
    return key in _VM_ALLOWED or _VM_ALLOWED_NUMBERED.fullmatch(key) is not None


def _vm_value_needs_root(key: str, value: object) -> bool:
    """Qemu.pm's value-dependent checks: a raw `host=` PCI device or a `romfile` (check_hostpci_perm), a
    host USB device other than spice (check_usb_perm), a serial port other than `socket`."""
    text = str(value)
    if key.startswith("hostpci"):
        options = _property_string(text, "host")
        return "mapping" not in options or "romfile" in options
    if key.startswith("usb"):
        options = _property_string(text, "host")
        return "mapping" not in options and options.get("host", "").lower() != "spice"
    if key.startswith("serial"):
        return text != "socket"
    return False


def _property_string(text: str, default_key: str) -> dict[str, str]:
    """A Proxmox property string (`0000:41:00,pcie=1`) as keys and values; a part without `=` is the
    format's default key (PVE::JSONSchema parse_property_string)."""
    options = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        options[key if sep else default_key] = value if sep else key
    return options


def _truthy(value: object) -> bool:
    return value not in (None, False, 0, "0", "")
