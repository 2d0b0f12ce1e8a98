"""The `ssh` backend: proxmoxer's paramiko session running `pvesh` on the node. An unknown host key is
refused,
never added; TCP_NODELAY is set on its socket (pvegpu/pve/nodelay.py); a connection that is gone (the node
rebooted) is re-established before the next call."""

from __future__ import annotations

import logging
import shlex
from typing import Any

import paramiko
from proxmoxer.backends.ssh_paramiko import SshParamikoSession

from pvegpu.pve.errors import PveConnectionError, PveConnectionLostError
from pvegpu.pve.nodelay import nodelay_transport
from pvegpu.pve.transport import CommandTransport

_LOG = logging.getLogger(__name__)


class _KnownHostsSession(SshParamikoSession):
    """proxmoxer's paramiko session, but an unknown host key is refused (proxmoxer auto-adds it)."""

    def __init__(self, known_hosts: str | None, **kwargs: Any) -> None:
        self.known_hosts = known_hosts
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def _connect(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.load_system_host_keys()
        if self.known_hosts is not None:
            client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=self.private_key_file,
                allow_agent=True,
                look_for_keys=self.private_key_file is None,
                timeout=self.timeout,
                transport_factory=nodelay_transport,
            )
        except BaseException:
            client.close()  # paramiko leaves the transport open on a refused key or login
            raise
        return client

    def run(self, argv: list[str]) -> tuple[str, str, int]:
        """Run `argv` on the node: (stdout, stderr, exit code).

        The connection is re-established first when it is gone (a reboot of the node drops it), and once
        more when opening the channel fails: the command was not sent then. A connection lost after it was
        sent raises PveConnectionLostError (it may have run: callers read back what they wrote)."""
        where = f"ssh {self.user}@{self.host}:{self.port}"
        try:
            channel = self._channel()
        except (paramiko.SSHException, EOFError, OSError):
            self._reconnect()
            try:
                channel = self._channel()
            except (paramiko.SSHException, EOFError, OSError) as error:
                raise PveConnectionError(f"{where}: {error or type(error).__name__}") from None
        lost = f"{where}: connection lost after the command was sent"
        try:
            channel.exec_command(shlex.join(argv))
            stdout = channel.makefile("rb", -1).read().decode()
            stderr = channel.makefile_stderr("rb", -1).read().decode()
            exit_code = channel.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as error:
            raise PveConnectionLostError(f"{lost}: {error or type(error).__name__}") from None
        if exit_code == -1 and _connection_ended(channel.get_transport()):
            raise PveConnectionLostError(f"{lost}: no exit status") from None
        return stdout, stderr, exit_code

    def _channel(self) -> paramiko.Channel:
        transport = self.ssh_client.get_transport()
        if transport is None or not transport.is_active():
            self._reconnect()
            transport = self.ssh_client.get_transport()
        if transport is None:
            raise paramiko.SSHException("SSH session not active")
        channel: paramiko.Channel = transport.open_session()
        return channel

    def _reconnect(self) -> None:
        _LOG.debug("Reconnecting to %s@%s:%s: the connection is gone", self.user, self.host, self.port)
        self.ssh_client.close()
        try:
            self.ssh_client = self._connect()
        except (paramiko.SSHException, OSError) as error:
            where = f"ssh {self.user}@{self.host}:{self.port}"
            raise PveConnectionError(f"{where}: reconnecting: {error}") from None


_TRANSPORT_END_S = 2.0


def _connection_ended(transport: paramiko.Transport) -> bool:
    """Whether the SSH connection under a channel that closed without an exit status has ended. Such a close
    is either the connection's end or a command killed by a signal (OpenSSH then sends `exit-signal`, which
    paramiko does not read); paramiko's transport thread closes the channels first and ends just after
    when the connection is gone, so it is given a moment."""
    transport.join(_TRANSPORT_END_S)
    return not transport.is_active()


def ssh_transport(
    host: str,
    user: str = "root",
    *,
    port: int = 22,
    key_filename: str | None = None,
    known_hosts: str | None = None,
    sudo: bool = False,
    timeout: float = 30,
) -> CommandTransport:
    """`pvesh` on `host` over SSH (paramiko), connected now. The host key must be in the system known_hosts
    or in `known_hosts`; otherwise PveConnectionError, nothing is added (as for a refused connection). A
    dropped connection (the node rebooted) is re-established before the next call
    (`_KnownHostsSession.run`)."""
    try:
        session = _KnownHostsSession(
            known_hosts, host=host, user=user, private_key_file=key_filename, port=port, timeout=timeout
        )
    except (paramiko.SSHException, OSError) as error:
        raise PveConnectionError(f"ssh {user}@{host}:{port}: {error}") from None

    def run(argv: list[str]) -> tuple[str, str, int]:
        _LOG.debug("Running pvesh on %s: %s", host, shlex.join(argv))  # scripts/bench.py counts these
        return session.run(argv)

    return CommandTransport(run, sudo=sudo)
