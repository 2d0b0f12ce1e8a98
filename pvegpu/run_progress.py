"""How far this run has got on a host: what the one-read-per-host caches (pvegpu/host_state.py,
pvegpu/node_state.py) key their reads on."""

from __future__ import annotations

from pyinfra.api.host import Host


def commands_run(target: Host) -> int:
    """How many of this run's operations on `target` have run commands so far (0 while pyinfra prepares)."""
    return sum(
        1
        for data in target.state.ops[target].values()
        if data.operation_meta.is_complete() and data.operation_meta.executed
    )
