"""The lab's STAND-IN for cloud-init inside a VM guest (NOT cloud-init): what a cloud image's first boot does
with the NoCloud data of the VM's Proxmox cloud-init drive, applied to the guest lab host's root before its
sshd starts (cloud-init's init stage runs before ssh.service too).

`setup(cloud_init, image)` reads the start request's `cloud_init` ({"user_data", "ipconfig0", "hostname",
"mac"}, lab/pve/hypervisor.py; None: the VM has no cloud-init drive) the way cloud-init would; `apply(root,
guest)` writes the result into the guest's root. Modelled, with cloud-init's rules (cc_set_hostname,
cc_users_groups, cc_ssh, cc_package_update_upgrade_install):

- `#cloud-config` user-data only (anything else is refused), parsed with YAML `safe_load`;
- `hostname` (else the VM's name) -> /etc/hostname;
- users: `users` (default `[default]`; "default" is the image's user, `debian` or `ubuntu`, renamed by a
  top-level `user`, which also adds it), each entry's `ssh_authorized_keys` go to that user; the top-level
  `ssh_authorized_keys` go to the default user (if any) and to root, behind cloud-init's `disable_root_opts`
  refusal prefix unless `disable_root: false`; a user's file is updated like cloud-init's
  `update_authorized_keys` (a key given again replaces its line). root's file starts empty (the image has
  none); other users are created (`useradd --root`) with a home and /bin/bash; `sudo` rules go to
  /etc/sudoers.d/90-cloud-init-users;
- host keys: `ssh_deletekeys` (default true) removes /etc/ssh/ssh_host_*key*; `ssh_keys` writes
  `<type>_private` / `<type>_public` (0600, as cloud-init does; a private key without its public half gets
  `ssh-keygen -y`'s); without `ssh_keys`, `ssh_genkeytypes` (default rsa, dsa, ecdsa, ed25519) generates the
  missing keys, of which the lab only makes ed25519 (the lab's sshd serves only that key);
- `packages` naming qemu-guest-agent: the guest agent runs (the hypervisor answers for it);
- network: ipconfig0 `ip=dhcp` (or none) -> any free lab address; a static `ip=10.200.<i>.2/24` (optional
  `gw=10.200.<i>.1`) -> lab address index i; any other address is refused (the lab cannot reach it).
Not modelled: runcmd, write_files, package installation itself, passwords, groups, IPv6, `#!` scripts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.errors import LabError
from lab.images import ImageMeta

# cloud-init's ssh_util.DISABLE_USER_OPTS.
DISABLE_ROOT_OPTS = (
    "no-port-forwarding,no-agent-forwarding,no-X11-forwarding,"
    'command="echo \'Please login as the user \\"$USER\\" rather than the user \\"$DISABLE_USER\\".\';'
    'echo;sleep 10;exit 142"'
)
HOST_KEY_TYPES = ("rsa", "dsa", "ecdsa", "ed25519")  # cloud-init's GENERATE_KEY_NAMES
AGENT_PACKAGE = "qemu-guest-agent"
SUDOERS = "etc/sudoers.d/90-cloud-init-users"
_LAB_ADDRESS = re.compile(r"10\.200\.(\d{1,3})\.2/24")


class CloudInitError(LabError, ValueError):
    """The VM's cloud-init data cannot be applied by the lab (the message says which key and why)."""


@dataclass(frozen=True)
class User:
    """A user cloud-init sets up: its authorized_keys lines (in order) and sudo rules."""

    name: str
    keys: tuple[str, ...] = ()
    sudo: tuple[str, ...] = ()


@dataclass(frozen=True)
class Guest:
    """What first boot makes of the guest: hostname, users (root first), host key files under /etc/ssh
    (name -> content), host key types to generate, whether the old host keys go, whether the guest agent
    runs, and the lab address index (None: DHCP, any free one)."""

    hostname: str
    users: tuple[User, ...]
    host_keys: dict[str, str] = field(default_factory=dict)
    generate_host_keys: tuple[str, ...] = ()
    delete_host_keys: bool = True
    agent: bool = False
    index: int | None = None


def default_user(image: ImageMeta) -> str:
    """The user a cloud image's cloud.cfg names `default_user` (Debian: debian, Ubuntu: ubuntu)."""
    return image.os.split("-", 1)[0]


def parse_user_data(text: str) -> dict[str, Any]:
    """The cloud-config mapping of `text`; CloudInitError for other user-data or YAML that is no mapping."""
    if not text.startswith("#cloud-config"):
        first = text.splitlines()[0] if text else ""
        raise CloudInitError(f"user-data: only #cloud-config is modelled by the lab, got {first[:40]!r}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CloudInitError(f"user-data: not YAML: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CloudInitError(f"user-data: a cloud-config is a mapping, got {type(data).__name__}")
    return data


def lab_index(ipconfig0: str | None) -> int | None:
    """The lab address index ipconfig0 asks for, None for DHCP; CloudInitError for any other address."""
    values = dict(part.partition("=")[::2] for part in (ipconfig0 or "").split(",") if part)
    ip = values.get("ip", "dhcp")
    if ip == "dhcp":
        return None
    match = _LAB_ADDRESS.fullmatch(ip)
    if match is None or not 1 <= int(match[1]) <= 250:
        raise CloudInitError(f"ipconfig0: ip={ip} is not a lab address (10.200.<1-250>.2/24)")
    index = int(match[1])
    if values.get("gw", f"10.200.{index}.1") != f"10.200.{index}.1":
        raise CloudInitError(f"ipconfig0: gw={values['gw']} is not the lab gateway 10.200.{index}.1")
    return index


def _strings(config: Mapping[str, Any], key: str) -> list[str]:
    value = config.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CloudInitError(f"user-data: {key} must be a list of strings")
    return value


def _key_id(line: str) -> tuple[str, str] | None:
    """(type, base64) of an authorized_keys line with or without options; None when there is no key."""
    tokens = line.split()
    for position, token in enumerate(tokens[:-1]):
        if token.startswith(("ssh-", "ecdsa-", "sk-")):
            return token, tokens[position + 1]
    return None


def _add_keys(lines: list[str], keys: list[str], options: str = "") -> list[str]:
    """cloud-init's update_authorized_keys: a key already present has its line replaced, new keys append."""
    result = list(lines)
    for key in keys:
        line = f"{options} {key}" if options else key
        wanted = _key_id(key)
        for position, old in enumerate(result):
            if wanted is not None and _key_id(old) == wanted:
                result[position] = line
                break
        else:
            result.append(line)
    return result


def _users(config: Mapping[str, Any], image: ImageMeta) -> tuple[str | None, list[dict[str, Any]]]:
    """(default user's name or None, the users in order as {"name", ...}) per cloud-init's
    normalize_users_groups."""
    old_user = config.get("user")
    if isinstance(old_user, str):
        old_user = {"name": old_user}
    if old_user is not None and not isinstance(old_user, dict):
        raise CloudInitError("user-data: user must be a name or a mapping")
    entries = config.get("users", ["default"])
    if isinstance(entries, str):
        entries = [name.strip() for name in entries.split(",")]
    if not isinstance(entries, list):
        raise CloudInitError("user-data: users must be a list")
    if old_user:
        entries = [*entries, "default"]
    default_name = (old_user or {}).get("name") or default_user(image)
    default: str | None = None
    users: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry == "default" or (isinstance(entry, dict) and entry.get("name") == "default"):
            default = str(default_name)
            users.setdefault(default, {"name": default})
        elif isinstance(entry, str):
            users.setdefault(entry, {"name": entry})
        elif isinstance(entry, dict) and isinstance(entry.get("name"), str):
            users[entry["name"]] = {**users.get(entry["name"], {}), **entry}
        else:
            raise CloudInitError(f"user-data: users: an entry needs a name: {entry!r}")
    return default, list(users.values())


def setup(cloud_init: Mapping[str, Any] | None, image: ImageMeta) -> Guest:
    """What `image`'s first boot makes of the VM's cloud-init data (None: no cloud-init drive: no keys, host
    keys generated, DHCP). CloudInitError for data the lab does not model or cannot route."""
    data = dict(cloud_init or {})
    config = parse_user_data(data["user_data"]) if data.get("user_data") is not None else {}
    hostname = config.get("hostname") or data.get("hostname") or "localhost"
    default, entries = _users(config, image)
    authorized: dict[str, list[str]] = {"root": []}
    sudo: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        keys = _strings(entry, "ssh_authorized_keys")
        authorized[entry["name"]] = _add_keys(authorized.get(entry["name"], []), keys)
        rules = entry.get("sudo")
        if rules:
            sudo[entry["name"]] = (rules,) if isinstance(rules, str) else tuple(map(str, rules))
    top_keys = _strings(config, "ssh_authorized_keys")
    if default is not None:
        authorized[default] = _add_keys(authorized.get(default, []), top_keys)
    disable_root = config.get("disable_root", True) not in (False, "false", "False", 0)
    options = ""
    if disable_root:
        options = str(config.get("disable_root_opts", DISABLE_ROOT_OPTS))
        options = options.replace("$USER", default or "NONE").replace("$DISABLE_USER", "root")
    authorized["root"] = _add_keys(authorized["root"], top_keys, options)

    ssh_keys = config.get("ssh_keys")
    host_keys: dict[str, str] = {}
    generate: tuple[str, ...] = ()
    if isinstance(ssh_keys, dict):
        for key_type in HOST_KEY_TYPES:
            for half, suffix in (("private", ""), ("public", ".pub")):
                value = ssh_keys.get(f"{key_type}_{half}")
                if isinstance(value, str):
                    host_keys[f"ssh_host_{key_type}_key{suffix}"] = value
    elif ssh_keys is None:
        generate = tuple(
            _strings(config, "ssh_genkeytypes") if "ssh_genkeytypes" in config else HOST_KEY_TYPES
        )
    else:
        raise CloudInitError("user-data: ssh_keys must be a mapping")

    packages = config.get("packages") or []
    if not isinstance(packages, list):
        raise CloudInitError("user-data: packages must be a list")
    names = {item if isinstance(item, str) else item[0] for item in packages if item}
    users = tuple(
        User(name, tuple(authorized[name]), sudo.get(name, ()))
        for name in ["root", *(entry["name"] for entry in entries if entry["name"] != "root")]
    )
    return Guest(
        hostname=str(hostname),
        users=users,
        host_keys=host_keys,
        generate_host_keys=generate,
        delete_host_keys=config.get("ssh_deletekeys", True) not in (False, "false", "False", 0),
        agent=AGENT_PACKAGE in names or image.agent,
        index=lab_index(data.get("ipconfig0")),
    )


def authorized_keys_text(user: User) -> str:
    """The authorized_keys file cloud-init leaves for `user` ("" when it has no keys)."""
    return "".join(f"{line}\n" for line in user.keys)


def sudoers_text(users: tuple[User, ...]) -> str:
    """/etc/sudoers.d/90-cloud-init-users for the users with sudo rules ("" when none)."""
    blocks = [
        f"\n# User rules for {user.name}\n" + "".join(f"{user.name} {rule}\n" for rule in user.sudo)
        for user in users
        if user.sudo
    ]
    return "# Created by cloud-init (pvegpu lab stand-in)\n" + "".join(blocks) if blocks else ""


def _run(*argv: str | Path) -> str:
    done = subprocess.run([str(a) for a in argv], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise CloudInitError(f"{argv[0]}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _write(path: Path, content: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    path.chmod(mode)


def apply(root: Path, guest: Guest) -> None:
    """Write `guest` into the guest's root (`/` of the guest as seen from the lab machine)."""
    _write(root / "etc/hostname", f"{guest.hostname}\n", 0o644)
    ssh = root / "etc/ssh"
    if guest.delete_host_keys:
        for old in ssh.glob("ssh_host_*key*"):
            old.unlink()
    for name, content in guest.host_keys.items():
        _write(ssh / name, content if content.endswith("\n") else content + "\n", 0o600)
    for key_type in HOST_KEY_TYPES:
        private, public = ssh / f"ssh_host_{key_type}_key", ssh / f"ssh_host_{key_type}_key.pub"
        if private.name in guest.host_keys and public.name not in guest.host_keys:
            _write(public, _run("ssh-keygen", "-y", "-f", private).strip() + " root@localhost\n", 0o600)
    if "ed25519" in guest.generate_host_keys and not (ssh / "ssh_host_ed25519_key").exists():
        _run(
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"root@{guest.hostname}",
            "-f",
            ssh / "ssh_host_ed25519_key",
        )
    for user in guest.users:
        home = root / "root" if user.name == "root" else root / "home" / user.name
        if user.name != "root" and not home.exists():
            _run("useradd", "--root", root, "--create-home", "--shell", "/bin/bash", user.name)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        _write(ssh_dir / "authorized_keys", authorized_keys_text(user), 0o600)
        if user.name != "root":
            owner = home.stat()
            for path in (ssh_dir, ssh_dir / "authorized_keys"):
                shutil.chown(path, owner.st_uid, owner.st_gid)
    sudoers = sudoers_text(guest.users)
    if sudoers:
        _write(root / SUDOERS, sudoers, 0o440)
