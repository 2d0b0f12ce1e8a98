"""The guest's host key pair, known_hosts line and address file on the operator's machine
(pvegpu/guest_keys.py), on real files in a temporary directory."""

from __future__ import annotations

import base64
import hashlib
import hmac
import stat
from pathlib import Path

import paramiko
import pytest

from pvegpu.guest_keys import (
    GuestKeyError,
    address_file,
    ensure_key_pair,
    host_key_files,
    known_host_recorded,
    known_hosts_line,
    record_address,
    record_known_host,
    recorded_address,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5HcbcUQrpSUxW4nw/rMoAjNHG/aykHEZ6M+9fVDl2P"
OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKkxdQojzjRQfF6QLujkv2HcSgBqCWg6RAl8lhzsW7VS"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_key_files_live_beside_known_hosts(tmp_path: Path) -> None:
    assert host_key_files(tmp_path / "known_hosts", "llm") == (
        tmp_path / "guest-keys/llm_ed25519",
        tmp_path / "guest-keys/llm_ed25519.pub",
    )
    assert address_file(tmp_path / "guest-keys/llm.lab_ed25519") == tmp_path / "guest-keys/llm.lab.address"


def test_ensure_key_pair_generates_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    private, public = host_key_files(tmp_path / "known_hosts", "llm")
    text, line = ensure_key_pair(private)
    assert (mode(private), mode(private.parent), mode(public)) == (0o600, 0o700, 0o644)
    assert private.read_text() == text
    assert text.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    loaded = paramiko.Ed25519Key.from_private_key_file(str(private))
    assert line == f"ssh-ed25519 {loaded.get_base64()}"
    assert public.read_text() == line + "\n"
    assert sorted(p.name for p in private.parent.iterdir()) == [
        "llm_ed25519",
        "llm_ed25519.pub",
    ]  # no temp left


def test_ensure_key_pair_keeps_the_key_and_rewrites_a_lost_public_half(tmp_path: Path) -> None:
    private, public = host_key_files(tmp_path / "known_hosts", "llm")
    first = ensure_key_pair(private)
    public.unlink()
    assert ensure_key_pair(private) == first
    assert public.read_text() == first[1] + "\n"


def test_ensure_key_pair_refuses_a_key_others_can_read(tmp_path: Path) -> None:
    private, _ = host_key_files(tmp_path / "known_hosts", "llm")
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
    private, _ = host_key_files(tmp_path / "known_hosts", "llm")
    private.parent.mkdir()
    assert recorded_address(private) is None
    record_address(private, "10.200.3.2")
    assert (tmp_path / "guest-keys/llm.address").read_text() == "10.200.3.2\n"
    assert recorded_address(private) == "10.200.3.2"
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        record_address(private, "10.200.3.2; rm -rf /")
    (tmp_path / "guest-keys/llm.address").write_text("garbage\n")
    with pytest.raises(GuestKeyError) as raised:
        recorded_address(private)
    assert (
        str(raised.value)
        == f"{tmp_path}/guest-keys/llm.address: 'garbage' is not an IP address; delete the file"
    )
