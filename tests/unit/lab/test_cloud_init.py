"""The lab's stand-in for cloud-init in a guest (lab/cloud_init.py): cloud-init's rules for users, keys, host
keys and the guest agent, the lab address from ipconfig0, and the exact files first boot leaves."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml

from lab import hosts
from lab.cloud_init import (
    CloudInitError,
    Guest,
    User,
    apply,
    lab_index,
    parse_user_data,
    setup,
)
from lab.hosts import LabHost
from lab.images import CATALOGUE

DEBIAN = CATALOGUE["debian-12-genericcloud-amd64.qcow2"]
UBUNTU = CATALOGUE["ubuntu-24.04-server-cloudimg-amd64.img"]
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA alice@laptop"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB bob@laptop"
REFUSAL = (
    "no-port-forwarding,no-agent-forwarding,no-X11-forwarding,command=\"echo 'Please login as the user "
    '\\"debian\\" rather than the user \\"root\\".\';echo;sleep 10;exit 142"'
)


def _user_data(config: Mapping[str, object]) -> str:
    return "#cloud-config\n" + yaml.safe_dump(config, sort_keys=True)


def _request(config: Mapping[str, object], ipconfig0: str | None = "ip=dhcp") -> dict[str, object]:
    return {
        "user_data": _user_data(config),
        "ipconfig0": ipconfig0,
        "hostname": "llm",
        "mac": "BC:24:11:AA:BB:CC",
    }


def _host_key(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "guest_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llm", "-f", path], check=True)
    return path.read_text(), path.with_suffix(".pub").read_text()


def test_setup_pvegpu_user_data() -> None:
    """The user-data pvegpu renders (issue 11 contract): root with the operator's keys, its own host key."""
    config = {
        "hostname": "llm",
        "disable_root": False,
        "users": [{"name": "root", "ssh_authorized_keys": [KEY_A, KEY_B]}],
        "ssh_keys": {"ed25519_private": "PRIVATE\n", "ed25519_public": "ssh-ed25519 AAAAHOST llm\n"},
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "packages": ["qemu-guest-agent"],
        "runcmd": [["systemctl", "enable", "--now", "qemu-guest-agent"]],
    }
    assert setup(_request(config, "ip=10.200.105.2/24,gw=10.200.105.1"), DEBIAN) == Guest(
        hostname="llm",
        users=(User("root", (KEY_A, KEY_B)),),
        host_keys={
            "ssh_host_ed25519_key": "PRIVATE\n",
            "ssh_host_ed25519_key.pub": "ssh-ed25519 AAAAHOST llm\n",
        },
        generate_host_keys=(),
        delete_host_keys=True,
        agent=True,
        index=105,
    )


def test_setup_default_user_and_root_refusal() -> None:
    """Top-level keys go to the image's default user and, behind cloud-init's refusal, to root."""
    guest = setup(_request({"ssh_authorized_keys": [KEY_A]}), DEBIAN)
    assert guest.users == (User("root", (f"{REFUSAL} {KEY_A}",)), User("debian", (KEY_A,)))
    assert (guest.hostname, guest.agent, guest.index, guest.host_keys) == ("llm", False, None, {})
    assert guest.generate_host_keys == ("rsa", "dsa", "ecdsa", "ed25519")


def test_setup_proxmox_generated_user_data_for_root() -> None:
    """Proxmox's own user-data with `ciuser: root`: `user: root`, `disable_root: False`, top-level keys."""
    text = (
        "#cloud-config\nhostname: llm\nmanage_etc_hosts: true\nfqdn: llm\nuser: root\ndisable_root: False\n"
        f"ssh_authorized_keys:\n  - {KEY_A}\nchpasswd:\n  expire: False\npackage_upgrade: true\n"
    )
    guest = setup({"user_data": text, "ipconfig0": None, "hostname": "llm", "mac": None}, UBUNTU)
    assert guest.users == (User("root", (KEY_A,)),)


def test_setup_root_listed_and_default_user_keeps_refusal_line() -> None:
    """A key given to root in `users` and again at top level: the later refusal line replaces it
    (update_authorized_keys), as cloud-init's ssh module runs after users-groups."""
    config = {
        "users": ["default", {"name": "root", "ssh_authorized_keys": [KEY_A]}],
        "ssh_authorized_keys": [KEY_A],
    }
    assert setup(_request(config), UBUNTU).users[0] == User(
        "root", (REFUSAL.replace('\\"debian\\"', '\\"ubuntu\\"') + f" {KEY_A}",)
    )


def test_setup_without_cloud_init_drive() -> None:
    guest = setup(None, DEBIAN)
    assert guest == Guest(
        hostname="localhost",
        users=(User("root", ()), User("debian", ())),
        generate_host_keys=("rsa", "dsa", "ecdsa", "ed25519"),
    )


def test_setup_sudo_rules() -> None:
    config = {"users": [{"name": "ops", "sudo": "ALL=(ALL) NOPASSWD:ALL", "ssh_authorized_keys": [KEY_B]}]}
    assert setup(_request(config), DEBIAN).users == (
        User("root", ()),
        User("ops", (KEY_B,), ("ALL=(ALL) NOPASSWD:ALL",)),
    )


@pytest.mark.parametrize(
    ("ipconfig0", "index"),
    [
        (None, None),
        ("ip=dhcp", None),
        ("ip=dhcp,ip6=auto", None),
        ("ip=10.200.7.2/24", 7),
        ("ip=10.200.107.2/24,gw=10.200.107.1", 107),
    ],
)
def test_lab_index(ipconfig0: str | None, index: int | None) -> None:
    assert lab_index(ipconfig0) == index


@pytest.mark.parametrize(
    ("ipconfig0", "message"),
    [
        (
            "ip=192.168.1.5/24,gw=192.168.1.1",
            "ipconfig0: ip=192.168.1.5/24 is not a lab address (10.200.<1-250>.2/24)",
        ),
        ("ip=10.200.7.3/24", "ipconfig0: ip=10.200.7.3/24 is not a lab address (10.200.<1-250>.2/24)"),
        ("ip=10.200.251.2/24", "ipconfig0: ip=10.200.251.2/24 is not a lab address (10.200.<1-250>.2/24)"),
        ("ip=10.200.7.2/24,gw=10.200.8.1", "ipconfig0: gw=10.200.8.1 is not the lab gateway 10.200.7.1"),
    ],
)
def test_lab_index_refused(ipconfig0: str, message: str) -> None:
    with pytest.raises(CloudInitError) as raised:
        lab_index(ipconfig0)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("#!/bin/sh\necho hi\n", "user-data: only #cloud-config is modelled by the lab, got '#!/bin/sh'"),
        ("#cloud-config\n- a\n", "user-data: a cloud-config is a mapping, got list"),
        ("#cloud-config\nusers: [\n", "user-data: not YAML"),
    ],
)
def test_parse_user_data_refused(text: str, message: str) -> None:
    with pytest.raises(CloudInitError) as raised:
        parse_user_data(text)
    assert str(raised.value).startswith(message)


def test_parse_user_data_empty() -> None:
    assert parse_user_data("#cloud-config\n") == {}


def _guest_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for folder in ("etc/ssh", "root/.ssh"):
        (root / folder).mkdir(parents=True)
    (root / "etc/hostname").write_text("t1n2v100\n")
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "ssh_host_rsa_key"):
        (root / "etc/ssh" / name).write_text("the lab's\n")
    (root / "etc/ssh/sshd_config").write_text("# kept\n")
    (root / "root/.ssh/authorized_keys").write_text("ssh-ed25519 AAAALAB pvegpu-lab@t1n2v100\n")
    return root


def _listing(root: Path) -> dict[str, tuple[str, str]]:
    return {
        str(path.relative_to(root)): (oct(path.stat().st_mode & 0o777), path.read_text())
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_apply_writes_exact_files(tmp_path: Path) -> None:
    private, public = _host_key(tmp_path)
    root = _guest_root(tmp_path)
    config = {
        "hostname": "llm",
        "disable_root": False,
        "users": [{"name": "root", "ssh_authorized_keys": [KEY_A, KEY_B]}],
        "ssh_keys": {"ed25519_private": private, "ed25519_public": public},
        "ssh_genkeytypes": [],
    }
    apply(root, setup(_request(config), DEBIAN))
    assert _listing(root) == {
        "etc/hostname": ("0o644", "llm\n"),
        "etc/ssh/sshd_config": ("0o644", "# kept\n"),
        "etc/ssh/ssh_host_ed25519_key": ("0o600", private),
        "etc/ssh/ssh_host_ed25519_key.pub": ("0o600", public),
        "root/.ssh/authorized_keys": ("0o600", f"{KEY_A}\n{KEY_B}\n"),
    }


def test_apply_derives_public_host_key(tmp_path: Path) -> None:
    private, public = _host_key(tmp_path)
    root = _guest_root(tmp_path)
    apply(root, setup(_request({"ssh_keys": {"ed25519_private": private}}), DEBIAN))
    derived = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text()
    # cloud-init's `echo "$(ssh-keygen -yf KEY)" root@localhost`: ssh-keygen -y keeps the key's comment.
    assert derived == public.strip() + " root@localhost\n"
    assert (root / "root/.ssh/authorized_keys").read_text() == ""


def test_apply_generates_missing_host_key(tmp_path: Path) -> None:
    root = _guest_root(tmp_path)
    apply(root, setup(None, DEBIAN))
    assert sorted(p.name for p in (root / "etc/ssh").iterdir()) == [
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
        "sshd_config",
    ]
    assert (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().startswith("ssh-ed25519 ")
    assert (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text() != "the lab's\n"


def test_apply_keeps_host_keys_without_deletekeys(tmp_path: Path) -> None:
    root = _guest_root(tmp_path)
    apply(root, setup(_request({"ssh_deletekeys": False}), DEBIAN))
    assert (root / "etc/ssh/ssh_host_rsa_key").read_text() == "the lab's\n"
    assert (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text() == "the lab's\n"


def _record(run: Path, name: str, index: int, recorded: bool) -> LabHost:
    host = LabHost(
        name, "nspawn", "reference", index, 1, 1, f"ssh-ed25519 AAAA{name}", "/sys", "/proc/cmdline"
    )
    host = replace(host, host_key_recorded=recorded)
    (run / name).mkdir(parents=True)
    (run / name / "host.json").write_text(json.dumps(asdict(host)))
    return host


def test_lab_known_hosts_keeps_the_deployers_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab writes lines for the hosts whose keys it records; a cloud-init guest's line (pvegpu's) and
    other foreign lines stay; a planted line at a recorded host's address goes, also once that host stops."""
    monkeypatch.setenv("PVEGPU_LAB_RUN", str(tmp_path))
    node = _record(tmp_path, "pve1", 3, recorded=True)
    _record(tmp_path, "pve1v100", 105, recorded=False)
    hosts.known_hosts_path().write_text(
        "10.200.105.2 ssh-ed25519 AAAAPVEGPU\n"  # pvegpu's line for the cloud-init guest
        "10.200.3.2 ssh-ed25519 AAAAPLANTED\n"  # not the key the lab recorded for pve1
        "# a comment\n"
    )
    hosts._write_known_hosts()
    assert hosts.known_hosts_path().read_text() == (
        "10.200.105.2 ssh-ed25519 AAAAPVEGPU\n# a comment\n10.200.3.2 ssh-ed25519 AAAApve1\n"
    )
    hosts.known_hosts_path().write_text(hosts.known_hosts_path().read_text() + "10.200.3.2 ssh-rsa AAAAOLD\n")
    (tmp_path / "pve1/host.json").unlink()
    hosts._write_known_hosts(released={node.address})
    assert hosts.known_hosts_path().read_text() == "10.200.105.2 ssh-ed25519 AAAAPVEGPU\n# a comment\n"
