"""pvegpu.pve.https behind a proxy: a pinned session never takes the environment's proxy (requests would build
the proxied pool without the pin), and with CA verification the certificate is still checked through the
proxy's CONNECT tunnel.

The node is the local TLS server of test_pve (a self-signed certificate for 127.0.0.1); the proxy is a plain
HTTP CONNECT proxy on 127.0.0.1 in a thread, which records every CONNECT it is asked for.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvegpu.models.pve import MappingState, PciMapping
from pvegpu.pve.errors import PveConnectionError
from pvegpu.pve.https import connect_https
from tests.unit.pve.test_client import DIGEST, MAP_1, Recorded
from tests.unit.pve.test_client import certificate as certificate  # noqa: PLC0414 (the fixture)
from tests.unit.pve.test_client import https_api as https_api  # noqa: PLC0414 (the fixture)

PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")


def _tunnel(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until either side closes or resets (5 s idle bound: a test never hangs here)."""
    sockets = [client, upstream]
    try:
        while readable := select.select(sockets, [], [], 5)[0]:
            for source in readable:
                data = source.recv(65536)
                if not data:
                    return
                (upstream if source is client else client).sendall(data)
    except OSError:  # a client that refused the certificate resets the connection
        return


def _proxy_one(client: socket.socket, connects: list[str]) -> None:
    with client:
        client.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head and (chunk := client.recv(4096)):
            head += chunk
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
        connects.append(f"{method} {target}")
        if method != "CONNECT":
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = target.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5) as upstream:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            _tunnel(client, upstream)


def _serve_proxy(listener: socket.socket, connects: list[str]) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # the listener was closed: the test is over
            return
        threading.Thread(target=_proxy_one, args=(client, connects), daemon=True).start()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A CONNECT proxy set in every proxy variable requests reads (and no `no_proxy`): what it was asked."""
    listener = socket.create_server(("127.0.0.1", 0))
    connects: list[str] = []
    thread = threading.Thread(target=_serve_proxy, args=(listener, connects), daemon=True)
    thread.start()
    address = f"http://127.0.0.1:{listener.getsockname()[1]}"
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, address)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield connects
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone does not)
    listener.close()
    thread.join(timeout=5)


def test_error_https_pinned_wrong_fingerprint_behind_a_proxy_is_refused(
    https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str], proxy: list[str]
) -> None:
    recorded, port = https_api
    wrong = ":".join(["AB"] * 32)
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, fingerprint=wrong)

    with pytest.raises(PveConnectionError) as raised:
        api.mappings()

    served = certificate[2].replace(":", "").lower()
    assert raised.value.message == (
        f"https://127.0.0.1:{port}/api2/json: HTTPSConnectionPool(host='127.0.0.1', port={port}): "
        "Max retries exceeded with url: /api2/json/cluster/mapping/pci (Caused by SSLError('Fingerprints did "
        f'not match. Expected "{"ab" * 32}", got "{served}"\'))'
    )
    assert (proxy, recorded.received) == ([], [])


def test_https_pinned_behind_a_proxy_connects_directly(
    https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str], proxy: list[str]
) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, fingerprint=certificate[2])

    assert api.mappings(check_node="pve1") == (MappingState(PciMapping("gpu0", (MAP_1,)), DIGEST, ()),)

    assert proxy == []
    assert [(method, path) for method, path, _, _ in recorded.received] == [
        ("GET", "/api2/json/cluster/mapping/pci?check-node=pve1")
    ]


def test_https_with_ca_file_goes_through_the_proxy_verified(
    https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str], proxy: list[str]
) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, ca_file=str(certificate[0]))

    assert api.mappings(check_node="pve1") == (MappingState(PciMapping("gpu0", (MAP_1,)), DIGEST, ()),)

    assert proxy == [f"CONNECT 127.0.0.1:{port}"]
    assert [(method, path) for method, path, _, _ in recorded.received] == [
        ("GET", "/api2/json/cluster/mapping/pci?check-node=pve1")
    ]


def test_error_https_system_cas_behind_a_proxy_still_verify(
    https_api: tuple[Recorded, int], proxy: list[str]
) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port)

    with pytest.raises(PveConnectionError) as raised:
        api.mappings()

    assert "CERTIFICATE_VERIFY_FAILED" in raised.value.message
    assert (proxy, recorded.received) == ([f"CONNECT 127.0.0.1:{port}"], [])
