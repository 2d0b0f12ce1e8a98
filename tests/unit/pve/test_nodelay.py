"""TCP_NODELAY on the SSH connections pvegpu opens (proxmoxer's session) and pyinfra opens (with the
`ssh_paramiko_connect_kwargs` of group_data/all.py), read back from the client sockets of a loopback SSH
server."""

from __future__ import annotations

import runpy
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paramiko.common import AUTH_FAILED, AUTH_SUCCESSFUL
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.connectors.ssh import SSHConnector

from pvegpu.pve.client import PveClient
from pvegpu.pve.nodelay import nodelay_transport
from pvegpu.pve.ssh import ssh_transport

REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Server:
    port: int
    known_hosts: str  # a known_hosts file with the server's key
    client_key: str  # the private key the server lets in


def _key_file(path: Path) -> str:
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    return str(path)


class _LetIn(paramiko.ServerInterface):
    """Accepts exactly one public key for any user."""

    def __init__(self, key: paramiko.PKey) -> None:
        self.key = key

    def get_allowed_auths(self, username: str) -> str:  # noqa: ARG002
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:  # noqa: ARG002
        return AUTH_SUCCESSFUL if key == self.key else AUTH_FAILED


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A paramiko SSH server on 127.0.0.1 that lets one client key in; it serves connections until the test
    ends."""
    host_key = paramiko.Ed25519Key.from_private_key_file(_key_file(tmp_path / "host_key"))
    client_key = _key_file(tmp_path / "client_key")
    known_hosts = tmp_path / "known_hosts"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    let_in = _LetIn(paramiko.Ed25519Key.from_private_key_file(client_key))
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener was shut down: the test is over
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transports.append(transport)
            transport.start_server(server=let_in)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield Server(port, str(known_hosts), client_key)
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close() would not)
    thread.join(10)
    listener.close()
    for transport in transports:
        transport.close()


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def _client_socket(port: int) -> socket.socket:
    """The client end of this process's one SSH connection to the server (paramiko runs a Transport thread
    per connection, server and client side alike)."""
    (sock,) = (
        t.sock
        for t in threading.enumerate()
        if isinstance(t, paramiko.Transport) and t.is_active() and t.sock.getpeername() == ("127.0.0.1", port)
    )
    assert isinstance(sock, socket.socket)
    return sock


def _group_data_all() -> dict[str, Any]:
    """The names group_data/all.py assigns: pyinfra execs the file and gives them to every host."""
    return runpy.run_path(str(REPO / "group_data" / "all.py"))


def _connected_pyinfra_host(server: Server, extra_data: dict[str, Any]) -> SSHConnector:
    """The SSH connector of a pyinfra host connected to `server`, its data completed by `extra_data`."""
    data = {
        "ssh_port": server.port,
        "ssh_user": "root",
        "ssh_key": server.client_key,
        "ssh_known_hosts_file": server.known_hosts,
        "ssh_strict_host_key_checking": "yes",
        "ssh_config_file": "/dev/null",
        **extra_data,
    }
    inventory = Inventory((["127.0.0.1"], data))  # type: ignore[no-untyped-call]
    State(inventory, Config())  # type: ignore[no-untyped-call]
    host = inventory.get_host("127.0.0.1")
    host.connect(raise_exceptions=True)
    assert host.connected
    assert isinstance(host.connector, SSHConnector)
    return host.connector


def test_pve_ssh_session_sets_tcp_nodelay(server: Server) -> None:
    api = PveClient(
        ssh_transport(
            "127.0.0.1",
            port=server.port,
            known_hosts=server.known_hosts,
            key_filename=server.client_key,
            timeout=5,
        )
    )
    assert _nodelay(_client_socket(server.port)) == 1
    del api  # connected until here


def test_pyinfra_connection_with_the_group_data_sets_tcp_nodelay(server: Server) -> None:
    kwargs = _group_data_all()["ssh_paramiko_connect_kwargs"]
    assert kwargs == {"transport_factory": nodelay_transport}
    connector = _connected_pyinfra_host(server, {"ssh_paramiko_connect_kwargs": kwargs})
    assert _nodelay(_client_socket(server.port)) == 1
    assert connector.client is not None
    connector.client.close()


def test_pyinfra_connection_without_it_keeps_nagle(server: Server) -> None:
    connector = _connected_pyinfra_host(server, {})
    assert _nodelay(_client_socket(server.port)) == 0
    assert connector.client is not None
    connector.client.close()
