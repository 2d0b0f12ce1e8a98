"""The guest's host key pair, known_hosts line and address file on the operator's machine
(pvegpu/local/guest_keys.py), on real files in a temporary directory."""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import os
import stat
from pathlib import Path

import paramiko
import pytest

from pvegpu.local.guest_keys import (
    GuestKeyError,
    GuestPlace,
    address_file,
    adopt_name_keyed_files,
    ensure_key_pair,
    host_key_files,
    known_host_recorded,
    known_hosts_line,
    login_key_files,
    record_address,
    record_known_host,
    recorded_address,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5HcbcUQrpSUxW4nw/rMoAjNHG/aykHEZ6M+9fVDl2P"
OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKkxdQojzjRQfF6QLujkv2HcSgBqCWg6RAl8lhzsW7VS"
PVE1 = GuestPlace(cluster=None, owner=None, node="pve1", vmid=100)  # a standalone node, the default owner


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_key_files_live_beside_known_hosts(tmp_path: Path) -> None:
    assert host_key_files(tmp_path / "known_hosts", PVE1) == (
        tmp_path / "guest-keys/pve1/pve1-100_ed25519",
        tmp_path / "guest-keys/pve1/pve1-100_ed25519.pub",
    )
    assert login_key_files(tmp_path / "known_hosts", PVE1) == (
        tmp_path / "guest-keys/pve1/pve1-100_login_ed25519",
        tmp_path / "guest-keys/pve1/pve1-100_login_ed25519.pub",
    )
    assert address_file(tmp_path / "guest-keys/pve1/pve1-100_ed25519") == (
        tmp_path / "guest-keys/pve1/pve1-100.address"
    )


@pytest.mark.parametrize(
    ("place", "scope"),
    [
        (GuestPlace(None, None, "pve1", 100), "pve1"),
        (GuestPlace("lab", None, "pve1", 100), "lab"),
        (GuestPlace("lab", "lab", "pve1", 100), "lab"),  # the default owner, set explicitly: the same files
        (GuestPlace(None, "pve1", "pve1", 100), "pve1"),
        (GuestPlace("lab", "team-a", "pve1", 100), "team-a@lab"),
        (GuestPlace(None, "team-a", "pve1", 100), "team-a@pve1"),
    ],
)
def test_the_scope_is_the_cluster_and_an_owner_other_than_the_default(place: GuestPlace, scope: str) -> None:
    assert (place.scope, place.stem) == (scope, "pve1-100")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (GuestPlace("staging", None, "pve1", 100), GuestPlace("prod", None, "pve1", 100)),  # two clusters
        (GuestPlace(None, None, "pve1", 100), GuestPlace(None, None, "pve2", 100)),  # two standalone nodes
        (GuestPlace("lab", "team-a", "pve1", 100), GuestPlace("lab", "team-b", "pve1", 100)),  # one cluster
    ],
)
def test_two_inventories_with_one_key_directory_share_no_guest_file(
    tmp_path: Path, first: GuestPlace, second: GuestPlace
) -> None:
    """Same vmid, same VM name, one known_hosts: each inventory's guest has its own keys and address."""
    known_hosts = tmp_path / "known_hosts"
    keys = [ensure_key_pair(host_key_files(known_hosts, place)[0]) for place in (first, second)]
    logins = [ensure_key_pair(login_key_files(known_hosts, place)[0]) for place in (first, second)]
    for place, address in ((first, "10.200.3.2"), (second, "10.200.4.2")):
        record_address(host_key_files(known_hosts, place)[0], address)
    assert keys[0] != keys[1]
    assert logins[0] != logins[1]
    assert [recorded_address(host_key_files(known_hosts, place)[0]) for place in (first, second)] == [
        "10.200.3.2",
        "10.200.4.2",
    ]
    assert len({*host_key_files(known_hosts, first), *host_key_files(known_hosts, second)}) == 4
    # a run of either finds its own guest's files, never the other's: no name-keyed file to adopt
    assert adopt_name_keyed_files(known_hosts, first, "llm") == []
    assert ensure_key_pair(host_key_files(known_hosts, first)[0]) == keys[0]


def _name_keyed(tmp_path: Path, vm_name: str = "llm") -> dict[str, tuple[str, int]]:
    """An earlier pvegpu's files for VM `vm_name`: name -> (content, mode)."""
    folder = tmp_path / "guest-keys"
    folder.mkdir(mode=0o700)
    host_text, host_line = ensure_key_pair(folder / f"{vm_name}_ed25519")
    login_text, login_line = ensure_key_pair(folder / f"{vm_name}_login_ed25519")
    record_address(folder / f"{vm_name}_ed25519", "10.200.3.2")
    return {
        f"{vm_name}_ed25519": (host_text, 0o600),
        f"{vm_name}_ed25519.pub": (host_line + "\n", 0o644),
        f"{vm_name}_login_ed25519": (login_text, 0o600),
        f"{vm_name}_login_ed25519.pub": (login_line + "\n", 0o644),
        f"{vm_name}.address": ("10.200.3.2\n", 0o644),
    }


def test_an_earlier_pvegpus_files_are_moved_never_regenerated(tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    old = _name_keyed(tmp_path)
    inodes = {name: (tmp_path / "guest-keys" / name).stat().st_ino for name in old}
    moved = adopt_name_keyed_files(known_hosts, PVE1, "llm")
    new = ["pve1-100_ed25519", "pve1-100_ed25519.pub", "pve1-100_login_ed25519"]
    new += ["pve1-100_login_ed25519.pub", "pve1-100.address"]
    assert moved == [tmp_path / "guest-keys/pve1" / name for name in new]
    assert sorted(p.name for p in (tmp_path / "guest-keys").iterdir()) == ["pve1"]
    assert mode(tmp_path / "guest-keys/pve1") == 0o700
    assert {target.name: (target.read_text(), mode(target), target.stat().st_ino) for target in moved} == {
        target: (*old[source], inodes[source]) for source, target in zip(old, new, strict=True)
    }  # the same files (inode, 0600 kept), not copies and never a new key
    private = host_key_files(known_hosts, PVE1)[0]
    assert ensure_key_pair(private)[0] == old["llm_ed25519"][0]
    assert recorded_address(private) == "10.200.3.2"
    assert adopt_name_keyed_files(known_hosts, PVE1, "llm") == []  # the second run: nothing to move


def test_a_move_cut_before_the_old_name_went_is_finished(tmp_path: Path) -> None:
    """Cut between the link and the unlink: both names are one file; the next run drops the old name."""
    known_hosts = tmp_path / "known_hosts"
    old = _name_keyed(tmp_path)
    private = host_key_files(known_hosts, PVE1)[0]
    private.parent.mkdir(mode=0o700)
    private.hardlink_to(tmp_path / "guest-keys/llm_ed25519")
    moved = adopt_name_keyed_files(known_hosts, PVE1, "llm")
    assert private not in moved
    assert len(moved) == 4
    assert (private.read_text(), mode(private)) == old["llm_ed25519"]
    assert not (tmp_path / "guest-keys/llm_ed25519").exists()


def test_files_at_both_names_that_differ_are_refused_and_left_as_they_are(tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    old = _name_keyed(tmp_path)
    private = host_key_files(known_hosts, PVE1)[0]
    new_text, _ = ensure_key_pair(private)
    with pytest.raises(GuestKeyError) as raised:
        adopt_name_keyed_files(known_hosts, PVE1, "llm")
    assert str(raised.value) == (
        f"{tmp_path}/guest-keys/llm_ed25519 (an earlier pvegpu's, named after the VM) and "
        f"{tmp_path}/guest-keys/pve1/pve1-100_ed25519 both exist and differ; keep the one the guest was made "
        "with and delete the other"
    )
    assert {
        name: ((tmp_path / "guest-keys" / name).read_text(), mode(tmp_path / "guest-keys" / name))
        for name in old
    } == old
    assert sorted(p.name for p in private.parent.iterdir()) == ["pve1-100_ed25519", "pve1-100_ed25519.pub"]
    assert private.read_text() == new_text


def test_ensure_key_pair_generates_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    private, public = host_key_files(tmp_path / "known_hosts", PVE1)
    text, line = ensure_key_pair(private)
    assert (mode(private), mode(private.parent), mode(private.parent.parent), mode(public)) == (
        0o600,
        0o700,
        0o700,
        0o644,
    )
    assert private.read_text() == text
    assert text.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    loaded = paramiko.Ed25519Key.from_private_key_file(str(private))
    assert line == f"ssh-ed25519 {loaded.get_base64()}"
    assert public.read_text() == line + "\n"
    assert sorted(p.name for p in private.parent.iterdir()) == [
        "pve1-100_ed25519",
        "pve1-100_ed25519.pub",
    ]  # no temp left


def test_ensure_key_pair_keeps_the_key_and_rewrites_a_lost_public_half(tmp_path: Path) -> None:
    private, public = host_key_files(tmp_path / "known_hosts", PVE1)
    first = ensure_key_pair(private)
    public.unlink()
    assert ensure_key_pair(private) == first
    assert public.read_text() == first[1] + "\n"


def test_ensure_key_pair_refuses_a_key_others_can_read(tmp_path: Path) -> None:
    private, _ = host_key_files(tmp_path / "known_hosts", PVE1)
    ensure_key_pair(private)
    private.chmod(0o644)
    with pytest.raises(GuestKeyError) as raised:
        ensure_key_pair(private)
    assert str(raised.value) == (
        f"{private}: mode 0644 lets others read the guest's private host key; chmod 600 it (or delete it "
        "and its VM's snippet to get a new key)"
    )


def test_known_hosts_line_leaves_the_comment_out() -> None:
    assert known_hosts_line("10.0.0.5", KEY + " llm") == f"10.0.0.5 {KEY}"


def test_record_known_host_replaces_only_that_address(tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        "# pve nodes\n"
        f"pve1.example.net {OLD}\n"
        f"10.0.0.5 {OLD}\n"
        f"10.0.0.50 {OLD}\n"
        f"llm,10.0.0.5 {OLD}\n"
        f"{hashed('10.0.0.5')} {OLD}\n"
        f"{hashed('10.0.0.6')} {OLD}\n"
        f"@revoked 10.0.0.5 {OLD}\n"
        "\n"
    )
    known_hosts.chmod(0o640)
    assert not known_host_recorded(known_hosts, "10.0.0.5", KEY)
    record_known_host(known_hosts, "10.0.0.5", KEY)
    assert known_hosts.read_text() == (
        "# pve nodes\n"
        f"pve1.example.net {OLD}\n"
        f"10.0.0.50 {OLD}\n"
        f"llm {OLD}\n"
        f"{hashed('10.0.0.6')} {OLD}\n"
        f"@revoked 10.0.0.5 {OLD}\n"
        "\n"
        f"10.0.0.5 {KEY}\n"
    )
    assert mode(known_hosts) == 0o640
    assert known_host_recorded(known_hosts, "10.0.0.5", KEY)


def test_record_known_host_leaves_a_recorded_key_where_it_is(tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    text = f"10.0.0.5 {KEY}\npve1 {OLD}\n"
    known_hosts.write_text(text)
    before = known_hosts.stat().st_ino
    record_known_host(known_hosts, "10.0.0.5", KEY)
    assert (known_hosts.read_text(), known_hosts.stat().st_ino) == (text, before)


def test_record_known_host_creates_the_file(tmp_path: Path) -> None:
    known_hosts = tmp_path / "new/known_hosts"
    assert not known_host_recorded(known_hosts, "fd00::5", KEY)
    record_known_host(known_hosts, "fd00::5", KEY + " comment")
    assert (known_hosts.read_text(), mode(known_hosts)) == (f"fd00::5 {KEY}\n", 0o644)
    assert [p.name for p in known_hosts.parent.iterdir()] == ["known_hosts"]


def test_address_round_trip(tmp_path: Path) -> None:
    private, _ = host_key_files(tmp_path / "known_hosts", PVE1)
    private.parent.mkdir(parents=True)
    assert recorded_address(private) is None
    record_address(private, "10.200.3.2")
    assert (tmp_path / "guest-keys/pve1/pve1-100.address").read_text() == "10.200.3.2\n"
    assert recorded_address(private) == "10.200.3.2"
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        record_address(private, "10.200.3.2; rm -rf /")
    (tmp_path / "guest-keys/pve1/pve1-100.address").write_text("garbage\n")
    with pytest.raises(GuestKeyError) as raised:
        recorded_address(private)
    assert (
        str(raised.value)
        == f"{tmp_path}/guest-keys/pve1/pve1-100.address: 'garbage' is not an IP address; delete the file"
    )


def test_a_move_that_fails_is_one_line_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _name_keyed(tmp_path)

    def no_space(*_: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(GuestKeyError) as raised:
        adopt_name_keyed_files(tmp_path / "known_hosts", PVE1, "llm")
    assert str(raised.value) == (
        f"{tmp_path}/guest-keys/llm_ed25519: not moved to {tmp_path}/guest-keys/pve1/pve1-100_ed25519: "
        "No space left on device"
    )
    assert (tmp_path / "guest-keys/llm_ed25519").exists()
