"""The operator's-machine side of a cloud-image guest's identity: its SSH host key pair, the known_hosts
line pyinfra checks it against, and (DHCP) the address the guest agent reported.

Files, beside the known_hosts file of the node's inventory data (`ssh_known_hosts_file`), one folder per
cluster and one stem per guest (`GuestPlace`), so two inventories sharing that directory never share a
guest's keys or address:

    <dir>/guest-keys/<scope>/<node>-<vmid>_ed25519        the guest's private host key, OpenSSH, 0600, never
                                                          printed
    <dir>/guest-keys/<scope>/<node>-<vmid>_ed25519.pub    its public half (`ssh-ed25519 <base64>`)
    <dir>/guest-keys/<scope>/<node>-<vmid>_login_ed25519  the key pyinfra logs in to the guest with (its
                                                          public half is in the guest's authorized_keys
                                                          through cloud-init), 0600
    <dir>/guest-keys/<scope>/<node>-<vmid>.address        a DHCP guest's address, as the guest agent reported

`<scope>` is `pve.cluster` (a standalone node: its `node.name`), as `<pve.owner>@<cluster>` when the
inventory's owner id (pvegpu.plan.ownership.owner_id) is not that: two inventories managing one cluster need
different owners, and neither may log in to the other's guest. Folders are 0700.

An earlier pvegpu named the files after the VM (`<dir>/guest-keys/<vm name>_ed25519`, ...):
`adopt_name_keyed_files` moves them to the new names on first use (a rename: same file, same 0600), never
generating new ones, since the guest's sshd still has that host key.

Every file is written whole or not at all (`pvegpu.local.files.write_whole`): a cut or a full disk leaves the
old file, and a failed write is one LocalWriteError line naming the file. `record_known_host` replaces only
the lines for one address; every other line stays as it was."""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pvegpu.local.files import write_whole
from pvegpu.plan.ownership import owner_id

GUEST_KEYS_DIR = "guest-keys"
_KEY_SUFFIX = "_ed25519"
_LOGIN = "_login"
_ADDRESS_SUFFIX = ".address"
_PRIVATE_MODE = 0o600
_PUBLIC_MODE = 0o644
_DIRECTORY_MODE = 0o700
_HASHED = "|1|"  # OpenSSH's HashKnownHosts form: |1|<base64 salt>|<base64 HMAC-SHA1 of the host name>


class GuestKeyError(Exception):
    """A guest key or address file that pvegpu will not use (too open, not ed25519, not an address)."""


@dataclass(frozen=True)
class GuestPlace:
    """Which guest a key or address file is of: the inventory's `pve.cluster` (None: a standalone node) and
    `pve.owner` (None: the default), the node's name and the guest's vmid."""

    cluster: str | None
    owner: str | None
    node: str
    vmid: int

    @property
    def scope(self) -> str:
        """The folder of this inventory's cluster in guest-keys (module docstring)."""
        return key_scope(self.cluster, self.owner, self.node)

    @property
    def stem(self) -> str:
        """`<node>-<vmid>`: the guest's files' name within its scope."""
        return f"{self.node}-{int(self.vmid)}"


def key_scope(cluster: str | None, owner: str | None, node: str) -> str:
    """The folder in guest-keys of the inventory with `pve.cluster` `cluster` and `pve.owner` `owner` for
    node `node`: `<cluster>`, or `<owner>@<cluster>` when the owner id is not the cluster's (module
    docstring); a standalone node's cluster is its name."""
    scope = cluster or node
    owner_of = owner_id(owner, cluster, node)
    return scope if owner_of == scope else f"{owner_of}@{scope}"


def guest_keys_directory(known_hosts: Path | str) -> Path:
    """`<dir of known_hosts>/guest-keys` (`~` expanded, as pyinfra reads `ssh_known_hosts_file`)."""
    return _expanded(known_hosts).parent / GUEST_KEYS_DIR


def host_key_files(known_hosts: Path | str, place: GuestPlace) -> tuple[Path, Path]:
    """(private, public) key file paths of the guest at `place` whose host key goes into `known_hosts`."""
    private = guest_keys_directory(known_hosts) / place.scope / f"{place.stem}{_KEY_SUFFIX}"
    return private, _public(private)


def login_key_files(known_hosts: Path | str, place: GuestPlace) -> tuple[Path, Path]:
    """(private, public) paths of the key pyinfra logs in to the guest at `place` with."""
    private = guest_keys_directory(known_hosts) / place.scope / f"{place.stem}{_LOGIN}{_KEY_SUFFIX}"
    return private, _public(private)


def address_file(private_key: Path) -> Path:
    """Where a DHCP guest's address is recorded: `<node>-<vmid>.address` beside its host key."""
    return private_key.with_name(private_key.name.removesuffix(_KEY_SUFFIX) + _ADDRESS_SUFFIX)


def adopt_name_keyed_files(known_hosts: Path | str, place: GuestPlace, vm_name: str) -> list[Path]:
    """Move the files an earlier pvegpu kept for VM `vm_name` (`guest-keys/<vm name>_ed25519`, its `.pub`,
    `_login_ed25519`, its `.pub`, `.address`) to `place`'s names; the new paths moved to, in that order.

    A rename keeps the file and its mode; a file already at the new path with the same content makes the
    old one a leftover copy, removed. GuestKeyError, before anything is moved, when both exist and differ:
    which one the guest has is not pvegpu's to guess; GuestKeyError naming both for a move that failed."""
    directory = guest_keys_directory(known_hosts)
    host_private, host_public = host_key_files(known_hosts, place)
    login_private, login_public = login_key_files(known_hosts, place)
    old = directory / f"{vm_name}{_KEY_SUFFIX}"
    old_login = directory / f"{vm_name}{_LOGIN}{_KEY_SUFFIX}"
    pairs = [
        (old, host_private),
        (_public(old), host_public),
        (old_login, login_private),
        (_public(old_login), login_public),
        (address_file(old), address_file(host_private)),
    ]
    pairs = [(source, target) for source, target in pairs if source.exists()]
    for source, target in pairs:
        if target.exists() and target.read_bytes() != source.read_bytes():
            raise GuestKeyError(
                f"{source} (an earlier pvegpu's, named after the VM) and {target} both exist and differ; "
                "keep the one the guest was made with and delete the other"
            )
    moved: list[Path] = []
    for source, target in pairs:
        try:
            if target.exists():
                source.unlink()  # the same bytes: a copy left by a move that was cut before the unlink
                continue
            _make_directory(target.parent)
            move_unreplaced(source, target)
        except OSError as error:
            raise GuestKeyError(f"{source}: not moved to {target}: {error.strerror or error}") from None
        moved.append(target)
    return moved


def move_unreplaced(source: Path, target: Path) -> None:
    """Rename `source` to `target` without replacing a file there: a hard link, then the old name unlinked
    (a cut leaves both names of one file, which the next run takes as a copy); a plain rename where the
    filesystem has no hard links."""
    try:
        os.link(source, target)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        os.rename(source, target)
        return
    source.unlink()


def _make_directory(scope: Path) -> None:
    """`scope` and the guest-keys folder above it, both 0700 when made here."""
    scope.parent.mkdir(mode=_DIRECTORY_MODE, parents=True, exist_ok=True)
    scope.mkdir(mode=_DIRECTORY_MODE, exist_ok=True)


def _public(private_key: Path) -> Path:
    return private_key.with_name(private_key.name + ".pub")


def ensure_key_pair(private_key: Path) -> tuple[str, str]:
    """(private key text, public key line) of the ed25519 key pair at `private_key` (a guest's host key or
    login key), generated and written (0600, in a 0700 directory) when the file does not exist; the `.pub`
    file is (re)written from it when missing or different. GuestKeyError for a key file others can read or
    that is not ed25519."""
    if private_key.exists():
        text = private_key.read_text()
        mode = private_key.stat().st_mode & 0o777
        if mode & 0o077:
            raise GuestKeyError(
                f"{private_key}: mode {mode:04o} lets others read the guest's private host key; "
                f"chmod 600 it (or delete it and its VM's snippet to get a new key)"
            )
        key = serialization.load_ssh_private_key(text.encode(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise GuestKeyError(f"{private_key}: not an ed25519 private key")
    else:
        key = Ed25519PrivateKey.generate()
        text = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ).decode()
        _make_directory(private_key.parent)
        write_whole(private_key, text, _PRIVATE_MODE)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = public.decode()
    public_file = _public(private_key)
    if not public_file.exists() or public_file.read_text() != line + "\n":
        write_whole(public_file, line + "\n", _PUBLIC_MODE)
    return text, line


def known_hosts_line(address: str, public_key: str) -> str:
    """`<address> <type> <base64>`: the known_hosts line of `public_key` (a comment is left out) at
    `address`, port 22."""
    key_type, key_base64 = public_key.split()[:2]
    return f"{address} {key_type} {key_base64}"


def known_host_recorded(known_hosts: Path | str, address: str, public_key: str) -> bool:
    """Whether `known_hosts` holds `public_key` for `address` and no other key for it."""
    lines = _lines(_expanded(known_hosts))
    return _with_host(lines, address, public_key) == lines


def record_known_host(known_hosts: Path | str, address: str, public_key: str) -> None:
    """Make `public_key` the only key `known_hosts` has for `address`: that address's other lines are
    removed (from a line that also names other hosts, only the address), every other line is kept, the
    new line goes last. Written atomically, keeping the file's mode (0644 for a new file); unchanged when
    the key is already the only one."""
    known_hosts = _expanded(known_hosts)
    lines = _lines(known_hosts)
    wanted = _with_host(lines, address, public_key)
    if wanted != lines:
        mode = known_hosts.stat().st_mode & 0o777 if known_hosts.exists() else _PUBLIC_MODE
        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        write_whole(known_hosts, "".join(f"{line}\n" for line in wanted), mode)


def record_address(private_key: Path, address: str) -> None:
    """Record the DHCP guest's `address` (an IP address; ValueError otherwise) beside its key."""
    ipaddress.ip_address(address)
    path = address_file(private_key)
    if not path.exists() or path.read_text() != f"{address}\n":
        write_whole(path, f"{address}\n", _PUBLIC_MODE)


def recorded_address(private_key: Path) -> str | None:
    """The address recorded for the guest of `private_key`; None when none is; GuestKeyError when the file
    holds something else than an IP address."""
    path = address_file(private_key)
    if not path.exists():
        return None
    text = path.read_text().strip()
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise GuestKeyError(f"{path}: {text[:60]!r} is not an IP address; delete the file") from None


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _expanded(path: Path | str) -> Path:
    """`path` with `~` expanded, as pyinfra reads `ssh_known_hosts_file`."""
    return Path(path).expanduser()


def _with_host(lines: list[str], address: str, public_key: str) -> list[str]:
    """`lines` with `known_hosts_line(address, public_key)` as the one entry for `address`."""
    ours = known_hosts_line(address, public_key)
    result: list[str] = []
    for line in lines:
        if line == ours and ours not in result:
            result.append(line)
            continue
        kept = _without_host(line, address)
        if kept is not None:
            result.append(kept)
    if ours not in result:
        result.append(ours)
    return result


def _without_host(line: str, address: str) -> str | None:
    """`line` without `address` among its host names: unchanged when it does not name it, None when it
    names only it. Comments, blank lines and `@marker` lines are kept as they are."""
    stripped = line.strip()
    if not stripped or stripped.startswith(("#", "@")):
        return line
    names, _, rest = stripped.partition(" ")
    hosts = names.split(",")
    left = [name for name in hosts if not _names_address(name, address)]
    if len(left) == len(hosts):
        return line
    return f"{','.join(left)} {rest}" if left else None


def _names_address(name: str, address: str) -> bool:
    if not name.startswith(_HASHED):
        return name.lower() == address.lower()
    salt, _, digest = name.removeprefix(_HASHED).partition("|")
    try:
        expected = hmac.new(base64.b64decode(salt), address.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(expected, base64.b64decode(digest))
    except ValueError:  # not valid base64: not a hashed entry OpenSSH would match either
        return False
