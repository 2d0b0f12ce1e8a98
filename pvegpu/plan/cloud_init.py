"""What cloud-init gives a VM made from a cloud image (`vm.image`): the image's volume, the user-data and
where it lives, and the guest's static address. Pure.

The user-data replaces Proxmox's generated one (`cicustom: user=<snippets_storage>:snippets/pvegpu-<vmid>-
user.yaml`), so it holds everything: the host name, `vm.user` with the login key pvegpu generated for
pyinfra and `vm.ssh_public_keys` (passwordless sudo when not root), the SSH host key pvegpu generated for
this guest (the operator's known_hosts has its public half before first contact; the image's own host
keys are deleted and none generated), and the QEMU guest agent, through which pvegpu learns a DHCP
guest's address. It is YAML written by PyYAML's safe dumper: a value with YAML syntax in it (a key comment
with `: ` or `#`) stays a string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from pvegpu.models.ipconfig import parse_ipconfig, static_interface
from pvegpu.models.vm import ImageUrl, VmSpec

_SUDO_ALL = "ALL=(ALL) NOPASSWD:ALL"


def image_volid(spec: VmSpec) -> str:
    """The volume the system disk is imported from: `vm.image.volume`, or `<storage>:import/<file name>`
    for an image the node downloads. ValueError for a spec without an image."""
    if spec.image is None:
        raise ValueError(f"VM {spec.vmid} has no vm.image")
    if isinstance(spec.image, ImageUrl):
        return f"{spec.image.storage}:import/{spec.image.stored_name}"
    return spec.image.volume


def snippet_name(vmid: int) -> str:
    """File name of the VM's user-data in the snippets directory: `pvegpu-<vmid>-user.yaml`."""
    return f"pvegpu-{vmid}-user.yaml"


def snippet_volid(spec: VmSpec) -> str:
    """The user-data snippet as a volume (`cicustom`'s `user=`): `<snippets_storage>:snippets/<name>`."""
    return f"{spec.snippets_storage}:snippets/{snippet_name(spec.vmid)}"


def made_by_cloud_init(values: Mapping[str, object], spec: VmSpec) -> bool:
    """Whether an existing VM's config gives its guest pvegpu's user-data (`cicustom: user=<snippet>`): a VM
    pvegpu made from `vm.image`, not one installed before (whose keys are not pvegpu's)."""
    parts = str(values.get("cicustom", "")).split(",")
    return f"user={snippet_volid(spec)}" in parts


def user_data(spec: VmSpec, host_key_private: str, host_key_public: str, login_public: str) -> str:
    """The `#cloud-config` user-data of the module docstring; the host key halves and the public half of
    pyinfra's login key (`pvegpu.local.guest_keys.login_key_files`) in OpenSSH format."""
    keys = [login_public, *spec.ssh_public_keys]
    user: dict[str, Any] = {"name": spec.user, "ssh_authorized_keys": keys}
    if spec.user != "root":
        user |= {"sudo": _SUDO_ALL, "shell": "/bin/bash", "lock_passwd": True}
    data: dict[str, Any] = {"hostname": spec.name}
    if spec.user == "root":
        data["disable_root"] = False  # else cloud-init makes root's keys print "log in as <user>" and exit
    data |= {
        "users": [user],
        "ssh_keys": {"ed25519_private": host_key_private, "ed25519_public": host_key_public},
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "packages": ["qemu-guest-agent"],
        "runcmd": [["systemctl", "enable", "--now", "qemu-guest-agent"]],
    }
    return "#cloud-config\n" + yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, width=1 << 16)


def static_address(ipconfig: str) -> str | None:
    """The guest's address from a valid `vm.ipconfig`: the static IPv4 one, else the static IPv6 one, else
    None (DHCP: the guest agent reports it)."""
    interface = static_interface(parse_ipconfig(ipconfig))
    return None if interface is None else str(interface.ip)


class _BlockDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing multi-line strings (the private key) as `|` blocks."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _string)
