"""guests_of: the guest hosts an inventory derives from its nodes' `vm` data (pvegpu/inventory/guests.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest

from pvegpu.inventory import guests as guest_inventory
from pvegpu.inventory.guests import guests_of
from pvegpu.local.guest_keys import (
    GuestPlace,
    ensure_key_pair,
    host_key_files,
    login_key_files,
    record_address,
    record_known_host,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5HcbcUQrpSUxW4nw/rMoAjNHG/aykHEZ6M+9fVDl2P you@desk"
GPUS = {"ids": ["10de:2bb1"], "count": 8}
IMAGE = {"volume": "local:import/debian-12.qcow2"}
PVE1 = GuestPlace(cluster=None, owner=None, node="pve1", vmid=100)  # node()'s guest


def node(
    tmp_path: Path, node_name: str = "pve1", pve: dict[str, object] | None = None, **vm: object
) -> tuple[str, dict[str, object]]:
    return (
        f"{node_name}.example.net",
        {
            **({} if pve is None else {"pve": pve}),
            "ssh_user": "root",
            "ssh_port": 2222,
            "ssh_key": "~/.ssh/pvegpu",
            "ssh_strict_host_key_checking": "yes",
            "ssh_known_hosts_file": str(tmp_path / "known_hosts"),
            "node": {"name": node_name, "gpus": GPUS},
            "vm": {"vmid": 100, "image": IMAGE, "ssh_public_keys": [KEY], **vm},
        },
    )


def made(tmp_path: Path, address: str | None = None, place: GuestPlace = PVE1) -> Path:
    """What pvegpu leaves when it makes the VM at `place`: the host and login key pairs, and (`address`)
    the known_hosts line; the private host key's path."""
    private, _ = host_key_files(tmp_path / "known_hosts", place)
    _, public = ensure_key_pair(private)
    ensure_key_pair(login_key_files(tmp_path / "known_hosts", place)[0])
    if address is not None:
        record_known_host(tmp_path / "known_hosts", address, public)
    return private


def test_a_static_guest_with_its_key_joins(tmp_path: Path) -> None:
    made(tmp_path, address="10.0.0.5")
    nodes = [node(tmp_path, ipconfig="ip=10.0.0.5/24,gw=10.0.0.1")]
    assert guests_of(nodes, {"sglang": {"served_model_name": "glm-5"}}) == [
        (
            "llm",
            {
                "ssh_hostname": "10.0.0.5",
                "ssh_user": "root",
                "ssh_key": str(tmp_path / "guest-keys/pve1/pve1-100_login_ed25519"),
                "ssh_known_hosts_file": str(tmp_path / "known_hosts"),
                "ssh_strict_host_key_checking": "yes",
                "guest_of": "pve1.example.net",
                "node": {"name": "llm", "profile": "vm", "gpus": GPUS},
                "sglang": {"served_model_name": "glm-5"},
            },
        )
    ]


def test_another_user_logs_in_with_sudo(tmp_path: Path) -> None:
    made(tmp_path, "10.0.0.7")
    [(name, data)] = guests_of([node(tmp_path, user="debian", name="gpu1", ipconfig="ip=10.0.0.7/24")])
    assert (name, data["ssh_user"], data["_sudo"], data["ssh_hostname"]) == (
        "gpu1",
        "debian",
        True,
        "10.0.0.7",
    )


def test_a_dhcp_guest_joins_once_its_address_is_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private = made(tmp_path)
    assert guests_of([node(tmp_path)]) == []
    assert capsys.readouterr().err == (
        "info: guest llm of pve1.example.net is not in this run's inventory: its DHCP address is not "
        f"recorded yet ({tmp_path}/guest-keys/pve1/pve1-100.address: written once the guest agent reports "
        "it); the next run includes it\n"
    )
    record_address(private, "10.200.7.2")
    record_known_host(
        tmp_path / "known_hosts", "10.200.7.2", private.with_name("pve1-100_ed25519.pub").read_text()
    )
    [(name, data)] = guests_of([node(tmp_path)])
    assert (name, data["ssh_hostname"]) == ("llm", "10.200.7.2")
    assert capsys.readouterr().err == ""


def test_a_guest_without_its_key_is_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert guests_of([node(tmp_path, ipconfig="ip=10.0.0.5/24")]) == []
    assert capsys.readouterr().err == (
        "info: guest llm of pve1.example.net is not in this run's inventory: its keys in "
        f"{tmp_path}/guest-keys/pve1 do not exist yet (made when pvegpu creates the VM); the next run "
        "includes it\n"
    )


def test_nodes_without_an_image_have_no_guest(capsys: pytest.CaptureFixture[str]) -> None:
    plain = ("pve3", {"node": {"name": "pve3", "gpus": GPUS}, "vm": {"vmid": 100}})
    assert guests_of([plain, ("pve4", {"node": {"name": "pve4", "gpus": GPUS}}), "bare"]) == []
    assert capsys.readouterr().err == ""


def test_two_nodes_with_one_vm_name_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made(tmp_path, address="10.0.0.5")
    nodes = [
        node(tmp_path, ipconfig="ip=10.0.0.5/24"),
        node(tmp_path, node_name="pve2", ipconfig="ip=10.0.0.6/24"),
    ]
    with pytest.raises(SystemExit) as raised:
        guests_of(nodes)
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        "pve2.example.net: vm.name: 'llm' is also the VM name of node pve1.example.net; guests_of names each "
        "guest host after its VM\n"
    )


PROBE = guest_inventory._answers  # the real probe, before the fixture below stands in for it
PROBE_ADDRESS = "127.0.0.1"


@pytest.fixture(autouse=True)
def sshd_answers(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The addresses whose sshd shows its banner (guests_of probes it): every address unless a test says."""
    answering: set[str] = set()
    monkeypatch.setattr(guest_inventory, "_answers", lambda address: not answering or address in answering)
    return answering


def test_a_guest_whose_sshd_does_not_answer_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sshd_answers: set[str]
) -> None:
    made(tmp_path, address="10.0.0.5")
    sshd_answers.add("10.0.0.6")
    assert guests_of([node(tmp_path, ipconfig="ip=10.0.0.5/24")]) == []
    assert capsys.readouterr().err == (
        "info: guest llm of pve1.example.net is not in this run's inventory: no sshd answers on 10.0.0.5:22 "
        "(its VM is stopped, or still booting); the next run includes it\n"
    )


def test_the_probe_wants_an_ssh_banner_not_an_open_port() -> None:
    """A listener that shows `SSH-2.0-...` answers; one that accepts and stays silent (a proxy) does not;
    a closed port does not."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def greet(banner: bytes) -> None:
            connection, _ = server.accept()
            with connection, contextlib.suppress(ConnectionResetError):
                connection.sendall(banner)
                connection.recv(1)  # until the probe hangs up

        for banner, answers in ((b"SSH-2.0-OpenSSH_9.2\r\n", True), (b"", False)):
            thread = threading.Thread(target=greet, args=(banner,))
            thread.start()
            assert PROBE(PROBE_ADDRESS, port) is answers
            thread.join()
    assert PROBE(PROBE_ADDRESS, port) is False  # closed now


def test_data_cannot_replace_what_guests_of_sets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        guests_of([], {"ssh_hostname": "10.9.9.9", "node": {"sysfs_root": "/opt/fakesys"}})
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        "guests_of: data key 'ssh_hostname' is set by guests_of from the node\n"
    )


def test_an_unusable_address_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private = made(tmp_path)
    private.with_name("pve1-100.address").write_text("not an address\n")
    with pytest.raises(SystemExit):
        guests_of([node(tmp_path)])
    assert capsys.readouterr().err == (
        f"pve1.example.net: vm: {tmp_path}/guest-keys/pve1/pve1-100.address: 'not an address' is not an IP "
        "address; delete the file\n"
    )


def test_the_guests_are_validated_like_any_guest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made(tmp_path, address="10.0.0.5")
    with pytest.raises(SystemExit):
        guests_of([node(tmp_path, ipconfig="ip=10.0.0.5/24")], {"sglang": {"tp_size": "8"}})
    assert capsys.readouterr().err == "llm: sglang.tp_size: must be a whole number (got '8')\n"


def test_a_guest_whose_key_is_not_in_known_hosts_yet_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made(tmp_path, address="10.0.0.9")  # another address: a VM made, then given a new ipconfig
    assert guests_of([node(tmp_path, ipconfig="ip=10.0.0.5/24")]) == []
    assert capsys.readouterr().err == (
        f"info: guest llm of pve1.example.net is not in this run's inventory: {tmp_path}/known_hosts has no "
        "line with its host key for 10.0.0.5 yet (written once the VM is made); the next run includes it\n"
    )


@pytest.mark.parametrize(
    ("first", "second", "scope"),
    [
        ({"cluster": "staging"}, {"cluster": "prod"}, "prod"),
        ({"cluster": "lab", "owner": "team-a"}, {"cluster": "lab", "owner": "team-b"}, "team-b@lab"),
    ],
)
def test_two_inventories_with_one_key_directory(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    first: dict[str, str],
    second: dict[str, str],
    scope: str,
) -> None:
    """Same node name, vmid and VM name, one known_hosts directory: the guest the first inventory made is
    not the second's, which neither gets its login key nor its address."""
    place = GuestPlace(first["cluster"], first.get("owner"), "pve1", 100)
    private = made(tmp_path, "10.200.7.2", place)
    record_address(private, "10.200.7.2")
    [(name, data)] = guests_of([node(tmp_path, pve=dict(first))])
    assert (name, data["ssh_hostname"], data["ssh_key"]) == (
        "llm",
        "10.200.7.2",
        str(login_key_files(tmp_path / "known_hosts", place)[0]),
    )
    assert guests_of([node(tmp_path, pve=dict(second))]) == []
    assert capsys.readouterr().err == (
        "info: guest llm of pve1.example.net is not in this run's inventory: its keys in "
        f"{tmp_path}/guest-keys/{scope} do not exist yet (made when pvegpu creates the VM); the next run "
        "includes it\n"
    )


def test_an_earlier_pvegpus_name_keyed_files_are_moved_on_first_use(tmp_path: Path) -> None:
    folder = tmp_path / "guest-keys"
    folder.mkdir(mode=0o700)
    host_text, host_line = ensure_key_pair(folder / "llm_ed25519")
    ensure_key_pair(folder / "llm_login_ed25519")
    record_address(folder / "llm_ed25519", "10.200.7.2")
    record_known_host(tmp_path / "known_hosts", "10.200.7.2", host_line)
    [(name, data)] = guests_of([node(tmp_path)])
    assert (name, data["ssh_hostname"], data["ssh_key"]) == (
        "llm",
        "10.200.7.2",
        str(folder / "pve1/pve1-100_login_ed25519"),
    )
    assert sorted(p.name for p in folder.iterdir()) == ["pve1"]
    assert (folder / "pve1/pve1-100_ed25519").read_text() == host_text  # the guest's key, not a new one
    assert guests_of([node(tmp_path)]) == [(name, data)]


def test_name_keyed_files_that_differ_from_the_new_ones_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made(tmp_path, "10.0.0.5")
    ensure_key_pair(tmp_path / "guest-keys/llm_ed25519")
    with pytest.raises(SystemExit) as raised:
        guests_of([node(tmp_path, ipconfig="ip=10.0.0.5/24")])
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        f"pve1.example.net: vm: {tmp_path}/guest-keys/llm_ed25519 (an earlier pvegpu's, named after the VM) "
        f"and {tmp_path}/guest-keys/pve1/pve1-100_ed25519 both exist and differ; keep the one the guest was "
        "made with and delete the other\n"
    )
