"""Cloud-init as qemu-server builds it for the lab hypervisor: the boot disk, user-data, snippets."""

from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from .drives import DRIVE_KEY, Drive, drive_keys
from .errors import DieError
from .formats import CICUSTOM_FMT, VOLUME_ID
from .jsonschema import P, parse_boolean, parse_property_string
from .storage import parse_volume

if TYPE_CHECKING:
    from .settings import Settings


def boot_disk(settings: Settings, conf: dict[str, str]) -> dict[str, str] | None:
    """The disk the VM boots from: the first disk of `boot: order=...` (else scsi0), with its volume's data
    file (a path on the node) for the lab hypervisor; None when there is none."""
    order = re.sub(r"^order=", "", conf.get("boot", "")).split(";")
    keys = [k for k in [*order, "scsi0"] if DRIVE_KEY.fullmatch(k) and k in conf]
    for key in keys:
        drive = Drive.parse(conf[key])
        if drive.is_cdrom or not VOLUME_ID.fullmatch(drive.file):
            continue
        return {"key": key, "volume": drive.file, "path": parse_volume(settings, drive.file).file}
    return None


def cloud_init_data(settings: Settings, vmid: str, conf: dict[str, str]) -> dict[str, Any] | None:
    """What Cloudinit.pm generates at start when the VM has a `vm-<vmid>-cloudinit` drive: the user-data
    (the cicustom `user` snippet, else cloudinit_userdata), and what the lab hypervisor needs besides.
    Every cicustom volume is read, as get_custom_cloudinit_files does."""
    if not any(f"vm-{vmid}-cloudinit" in Drive.parse(conf[k]).file for k in drive_keys(conf)):
        return None
    custom = parse_property_string(P(props=CICUSTOM_FMT), conf.get("cicustom", ""))
    texts = {
        kind: _snippet(settings, custom[kind])
        for kind in ("network", "user", "meta", "vendor")
        if kind in custom
    }
    net0 = re.match(r"(?:[a-z0-9]+|macaddr)=([0-9A-Fa-f:]{17})", conf.get("net0", ""))
    return {
        "user_data": texts.get("user", cloudinit_userdata(conf, vmid)),
        "ipconfig0": conf.get("ipconfig0"),
        "hostname": _hostname_fqdn(conf, vmid)[0],
        "mac": net0.group(1) if net0 else None,
    }


def _snippet(settings: Settings, volid: str) -> str:
    """Cloudinit.pm read_cloudinit_snippets_file."""
    volume = parse_volume(settings, volid)
    if volume.vtype != "snippets":
        raise DieError(f"{volid} is not in the snippets directory\n")
    data = settings.path(volume.file)
    if not data.is_file():
        raise DieError(f"can't find file '{volid}'\n")
    return data.read_bytes()[: 1024 * 1024].decode(errors="replace")


def _hostname_fqdn(conf: dict[str, str], vmid: str) -> tuple[str, str]:
    hostname = conf.get("name", f"VM{vmid}")
    if "." in hostname:
        return hostname.split(".", 1)[0], hostname
    if conf.get("searchdomain"):
        return hostname, f"{hostname}.{conf['searchdomain']}"
    return hostname, hostname


def cloudinit_userdata(conf: dict[str, str], vmid: str) -> str:
    """Cloudinit.pm cloudinit_userdata: the user-data Proxmox generates from name, ciuser, cipassword,
    sshkeys and ciupgrade."""
    hostname, fqdn = _hostname_fqdn(conf, vmid)
    content = f"#cloud-config\nhostname: {hostname}\nmanage_etc_hosts: true\nfqdn: {fqdn}\n"
    username = conf.get("ciuser")
    if username is not None:
        content += f"user: {username}\n"
        if username == "root":
            content += "disable_root: False\n"
    if "cipassword" in conf:
        content += f"password: {conf['cipassword']}\n"
    if "sshkeys" in conf:
        keys = [k for k in urllib.parse.unquote(conf["sshkeys"]).split("\n") if k.strip()]
        content += "ssh_authorized_keys:\n" + "".join(f"  - {k}\n" for k in keys)
    content += "chpasswd:\n  expire: False\n"
    if username != "root":
        content += "users:\n  - default\n"
    if parse_boolean(conf.get("ciupgrade", "1")) != 0:
        content += "package_upgrade: true\n"
    return content


def net0_mac(conf: dict[str, str]) -> str | None:
    """net0's MAC (the NIC an installed system's guest agent reports), None without one."""
    net0 = re.match(r"(?:[a-z0-9]+|macaddr)=([0-9A-Fa-f:]{17})", conf.get("net0", ""))
    return net0.group(1) if net0 else None
