"""TCP_NODELAY on the SSH connections pvegpu opens (proxmoxer's session) and pyinfra opens (with the
`ssh_paramiko_connect_kwargs` of group_data/all.py), read back from the client sockets of a loopback SSH
server."""

from __future__ import annotations

import runpy
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.connectors.ssh import SSHConnector

from pvegpu.pve.client import PveClient
from pvegpu.pve.ssh import ssh_transport
from pvegpu.run.early_read import pyinfra_transport
from tests.unit.loopback_ssh import Server, loopback_sshd

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A loopback SSH server that lets one client key in, until the test ends."""
    with loopback_sshd(tmp_path) as server:
        yield server


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
    inventory = Inventory((["127.0.0.1"], {**server.host_data(), **extra_data}))  # type: ignore[no-untyped-call]
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
    assert kwargs == {"transport_factory": pyinfra_transport}  # nodelay_transport, and the early reads
    connector = _connected_pyinfra_host(server, {"ssh_paramiko_connect_kwargs": kwargs})
    assert _nodelay(_client_socket(server.port)) == 1
    assert connector.client is not None
    connector.client.close()


def test_pyinfra_connection_without_it_keeps_nagle(server: Server) -> None:
    connector = _connected_pyinfra_host(server, {})
    assert _nodelay(_client_socket(server.port)) == 0
    assert connector.client is not None
    connector.client.close()
