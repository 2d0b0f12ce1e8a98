"""The ssh backend after the node reboots: the next API call re-establishes the connection instead of
failing with paramiko's `SSH session not active` (what proxmoxer's session did on a first run's mapping sync
after the reboot). Against a real paramiko SSH server on 127.0.0.1 that runs nothing: it answers every exec
with `[]` (an empty mapping list, as pvesh prints it) and records the command.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveConnectionError, PveConnectionLostError
from pvegpu.pve.ssh import ssh_transport


def _key(path: Path) -> paramiko.Ed25519Key:
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    return paramiko.Ed25519Key.from_private_key_file(str(path))


@dataclass
class Node:
    """The SSH side of a node: its port, its live connections (closed by `reboot`), what it ran."""

    port: int
    host_key: paramiko.PKey
    client_key: paramiko.PKey
    transports: list[paramiko.Transport] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    connections: int = 0
    drops: int = 0  # commands received and then cut off: the connection ends before they answer

    def reboot(self) -> None:
        """Drop every connection, as the node going down does, and stay down a moment: a real reboot takes
        minutes, long enough for the client's transport to see its connection closed."""
        for transport in self.transports:
            transport.close()
        time.sleep(1)


class _Server(paramiko.ServerInterface):
    def __init__(self, node: Node) -> None:
        self.node = node

    def check_auth_publickey(
        self,
        username: str,  # noqa: ARG002
        key: paramiko.PKey,
    ) -> int:
        return 0 if key == self.node.client_key else 2  # AUTH_SUCCESSFUL, AUTH_FAILED

    def get_allowed_auths(self, username: str) -> str:  # noqa: ARG002
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:  # noqa: ARG002
        return 0 if kind == "session" else 1  # OPEN_SUCCEEDED, OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.node.commands.append(command.decode())
        if self.node.drops:
            self.node.drops -= 1

            def cut() -> None:
                time.sleep(0.5)  # after paramiko's reply to the exec request: the command was sent
                channel.get_transport().close()

            threading.Thread(target=cut, daemon=True).start()
            return True

        def answer() -> None:
            channel.sendall(b"[]\n")
            channel.send_exit_status(0)
            # EOF, not close: a close may overtake paramiko's reply to the exec request ("Channel closed").
            channel.shutdown_write()

        threading.Thread(target=answer, daemon=True).start()
        return True


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Node, str, str]]:
    """A node, the client's key file and a known_hosts file naming the node's host key."""
    listener = socket.create_server(("127.0.0.1", 0))
    state = Node(listener.getsockname()[1], _key(tmp_path / "host_key"), _key(tmp_path / "client_key"))
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{state.port} {state.host_key.get_name()} {state.host_key.get_base64()}\n")
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            transport = paramiko.Transport(conn)
            transport.add_server_key(state.host_key)
            state.transports.append(transport)
            state.connections += 1
            transport.start_server(server=_Server(state))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield state, str(tmp_path / "client_key"), str(known)
    stop.set()
    thread.join(5)
    state.reboot()
    listener.close()


def test_drift_the_call_after_a_reboot_reconnects_and_runs(node: tuple[Node, str, str]) -> None:
    state, key, known = node
    api = PveClient(
        ssh_transport("127.0.0.1", port=state.port, key_filename=key, known_hosts=known, timeout=5)
    )
    assert api.mappings() == ()

    state.reboot()
    assert api.mappings() == ()

    assert state.connections == 2
    assert state.commands == ["pvesh get /cluster/mapping/pci --output-format json"] * 2


def test_error_a_node_that_does_not_come_back_fails_the_call_in_one_line(node: tuple[Node, str, str]) -> None:
    state, key, known = node
    api = PveClient(
        ssh_transport("127.0.0.1", port=state.port, key_filename=key, known_hosts=known, timeout=5)
    )
    state.client_key = _key(Path(known).with_name("other_key"))  # the node refuses the key once back

    state.reboot()
    with pytest.raises(PveConnectionError) as error:
        api.mappings()

    # paramiko's own reason varies with timing ("Authentication failed.", "No existing session"): ours not.
    where = f"GET /cluster/mapping/pci: ssh root@127.0.0.1:{state.port}: reconnecting: "
    assert error.value.line.startswith(where)
    assert "\n" not in error.value.line
    assert state.connections == 2


def test_drift_a_read_the_connection_drops_under_is_sent_once_more(node: tuple[Node, str, str]) -> None:
    state, key, known = node
    api = PveClient(
        ssh_transport("127.0.0.1", port=state.port, key_filename=key, known_hosts=known, timeout=5)
    )
    state.drops = 1

    assert api.mappings() == ()

    assert state.connections == 2
    assert state.commands == ["pvesh get /cluster/mapping/pci --output-format json"] * 2


def test_error_a_write_the_connection_drops_under_is_not_sent_again(node: tuple[Node, str, str]) -> None:
    state, key, known = node
    api = PveClient(
        ssh_transport("127.0.0.1", port=state.port, key_filename=key, known_hosts=known, timeout=5)
    )
    state.drops = 1

    with pytest.raises(PveConnectionLostError) as error:
        api.delete_mapping("gpu0")

    assert error.value.line == (
        f"DELETE /cluster/mapping/pci/gpu0: ssh root@127.0.0.1:{state.port}: "
        "connection lost after the command was sent: no exit status"
    )
    assert state.commands == ["pvesh delete /cluster/mapping/pci/gpu0 --output-format json"]
    assert api.mappings() == ()  # the next call reconnects
    assert state.connections == 2
