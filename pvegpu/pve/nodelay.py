"""TCP_NODELAY on every SSH connection pvegpu makes: proxmoxer's (`pvegpu.pve.ssh.ssh_transport`) and
pyinfra's.

paramiko sets no socket option, so Nagle's algorithm holds each small SSH packet until the previous one is
acknowledged, and Linux delays that ACK by ~40 ms: every remote command of a run waits for it (a no-op site
run on the lab node + guest: 4.43 s with Nagle, 2.80 s without). This stands in for the upstream fix,
paramiko's `SSHClient.connect` setting TCP_NODELAY on the socket it opens (as OpenSSH does); drop it then.

The hook is paramiko's own: `SSHClient.connect(transport_factory=nodelay_transport)`. pvegpu.pve passes it;
pyinfra passes it from its `ssh_paramiko_connect_kwargs` host data, which `group_data/all.py` sets for every
host of every inventory pyinfra loads from the repository root. A function, not a Transport subclass, so that
`pyinfra INVENTORY debug-inventory --json` can still print the host data.
"""

from __future__ import annotations

import socket
from typing import Any

import paramiko


def nodelay_transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """`paramiko.Transport(sock, **kwargs)` with TCP_NODELAY set on its TCP socket. A transport over something
    else (a ProxyCommand pipe, a jump host's channel) is left as it is: that TCP hop is not this process's."""
    transport = paramiko.Transport(sock, **kwargs)
    if isinstance(transport.sock, socket.socket) and transport.sock.family in (
        socket.AF_INET,
        socket.AF_INET6,
    ):
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return transport
