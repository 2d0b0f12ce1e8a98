"""Whether a new guest's sshd answers with the host key pvegpu gave it: the SSH handshake only (no login),
so the first contact is already strict. No pyinfra: the VM role calls it after a start."""

from __future__ import annotations

import base64
import hashlib
import socket

import paramiko

from pvegpu.run.wait import WaitTimeoutError, wait_until

_CONNECT_S = 5.0


class HostKeyMismatchError(Exception):
    """The guest answered with another host key than the one pvegpu gave it: never trusted."""


def fingerprint(key_base64: str) -> str:
    """OpenSSH's `SHA256:...` fingerprint of a public key."""
    digest = hashlib.sha256(base64.b64decode(key_base64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def served_host_key(address: str, key_type: str, port: int = 22) -> tuple[str, str]:
    """(type, base64) of the host key the sshd at `address` shows for `key_type`; OSError or
    paramiko.SSHException when it does not answer yet."""
    with socket.create_connection((address, port), timeout=_CONNECT_S) as sock:
        transport = paramiko.Transport(sock)
        try:
            transport.get_security_options().key_types = (key_type,)
            transport.start_client(timeout=_CONNECT_S)
            key = transport.get_remote_server_key()
            return key.get_name(), key.get_base64()
        finally:
            transport.close()


def wait_for_host_key(address: str, public_key: str, timeout_s: float, what: str) -> None:
    """Wait until the sshd at `address` answers with `public_key` (`<type> <base64> [comment]`).

    Raises HostKeyMismatchError at once for another key, WaitTimeoutError(`what`) when it never answers."""
    key_type, key_base64 = public_key.split()[:2]

    def pending() -> str | None:
        try:
            served = served_host_key(address, key_type)
        except (OSError, paramiko.SSHException, EOFError) as error:
            return f"{address}:22: {error or type(error).__name__}"
        if served != (key_type, key_base64):
            raise HostKeyMismatchError(
                f"{address} answers with host key {fingerprint(served[1])}, not the key pvegpu gave "
                f"the guest ({fingerprint(key_base64)}): not trusted"
            )
        return None

    wait_until(pending, timeout_s, what, interval_s=2.0)


__all__ = ["HostKeyMismatchError", "WaitTimeoutError", "fingerprint", "wait_for_host_key"]
