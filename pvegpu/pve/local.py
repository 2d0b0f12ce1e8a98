"""The `local` backend: proxmoxer's local session running `pvesh` on this node."""

from __future__ import annotations

from proxmoxer.backends.local import LocalSession

from pvegpu.pve.client import PveClient
from pvegpu.pve.transport import CommandTransport


def connect_local(*, sudo: bool = False, timeout: float = 600) -> PveClient:
    """A client running `pvesh` on this node (proxmoxer's local session); `timeout` bounds one call,
    which under pvesh includes a whole task."""
    session = LocalSession(timeout=timeout)  # type: ignore[no-untyped-call]

    def run(argv: list[str]) -> tuple[str, str, int]:
        stdout, stderr, exit_code = session._exec(argv)  # type: ignore[no-untyped-call]
        return str(stdout), str(stderr), int(exit_code)

    return PveClient(CommandTransport(run, sudo=sudo))
