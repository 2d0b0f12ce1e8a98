"""A paramiko SSH server on 127.0.0.1 for the unit tier: it lets one client key in and runs each `exec`
request with `sh -c` on this machine, as sshd does, keeping the commands it ran in order. pyinfra's SSH
connector and pvegpu's transports are then tested over a real SSH connection, with no lab host."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paramiko.common import (
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)


@dataclass(frozen=True)
class Server:
    port: int
    known_hosts: str  # a known_hosts file with the server's key
    client_key: str  # the private key the server lets in
    commands: list[str] = field(default_factory=list)  # each exec request's command, in order received
    finished: list[str] = field(default_factory=list)  # each command once it has exited, in that order

    def host_data(self) -> dict[str, object]:
        """pyinfra host data that reaches this server, its host key checked strictly."""
        return {
            "ssh_port": self.port,
            "ssh_user": "root",
            "ssh_key": self.client_key,
            "ssh_known_hosts_file": self.known_hosts,
            "ssh_strict_host_key_checking": "yes",
            "ssh_config_file": "/dev/null",
        }

    def wait_finished(self, count: int) -> None:
        """Wait (5 s at most) until `count` commands have exited."""
        deadline = time.monotonic() + 5
        while len(self.finished) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.finished) >= count, self.finished


def _key_file(path: Path) -> str:
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    return str(path)


def _run(channel: paramiko.Channel, command: str, finished: list[str]) -> None:
    """Run `command` as sshd would (`sh -c`), its output and exit status back: after the exec request's
    reply, as sshd sends them. paramiko sends that reply in its own thread once `check_channel_exec_request`
    returns, so a fast command could close the channel first, which a paramiko client takes as a refused
    request (`Channel closed.`); the client's EOF (every client here closes stdin once the exec is
    acknowledged) says the reply is out."""
    done = subprocess.run(["sh", "-c", command], capture_output=True, stdin=subprocess.DEVNULL, check=False)
    finished.append(command)
    deadline = time.monotonic() + 10
    while not (channel.eof_received or channel.closed) and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        channel.sendall(done.stdout)
        channel.sendall_stderr(done.stderr)
        channel.send_exit_status(done.returncode)
    except OSError:
        pass  # the client closed the channel first: what it sent is lost, as with sshd
    channel.close()


class _Sshd(paramiko.ServerInterface):
    """Accepts exactly one public key for any user, and session channels with `exec` requests."""

    def __init__(self, key: paramiko.PKey, server: Server) -> None:
        self.key = key
        self.server = server

    def get_allowed_auths(self, username: str) -> str:  # noqa: ARG002
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:  # noqa: ARG002
        return AUTH_SUCCESSFUL if key == self.key else AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:  # noqa: ARG002
        return OPEN_SUCCEEDED if kind == "session" else OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.server.commands.append(command.decode())
        runner = threading.Thread(
            target=_run, args=(channel, command.decode(), self.server.finished), daemon=True
        )
        runner.start()
        return True


@contextmanager
def loopback_sshd(directory: Path) -> Iterator[Server]:
    """The server, its keys and known_hosts in `directory`; it serves connections until the block ends."""
    host_key = paramiko.Ed25519Key.from_private_key_file(_key_file(directory / "host_key"))
    client_key = _key_file(directory / "client_key")
    known_hosts = directory / "known_hosts"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    server = Server(port, str(known_hosts), client_key)
    sshd = _Sshd(paramiko.Ed25519Key.from_private_key_file(client_key), server)
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener was shut down: the block is over
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transports.append(transport)
            transport.start_server(server=sshd)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close() would not)
        thread.join(10)
        listener.close()
        for transport in transports:
            transport.close()
