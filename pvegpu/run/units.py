"""`reload_if(target, unit, *written)`: the `_if` of `systemctl daemon-reload` after pvegpu writes a systemd
unit's file (and of the rerun of a oneshot unit it changed).

True when this run wrote the file (`written`, pyinfra's `any_changed`: a shortcut), or when the host's state
read shows systemd holding an older file than the one on disk (`NeedDaemonReload=yes`, pvegpu/facts/
host_read.py's `units`): a run that wrote the file and stopped before the reload leaves that, and the next run
finishes it. So the reload follows what the host shows, not only what this run did."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra.api.host import Host
from pyinfra.api.operation import OperationMeta
from pyinfra.operations.util import any_changed

from pvegpu.run.host_state import state_of


def reload_if(target: Host, unit: str, *written: OperationMeta) -> Callable[[], bool]:
    """(module docstring); a unit the read does not show (a host without systemd running prints none) has
    nothing loaded to be older than its file."""
    changed = any_changed(*written)
    state = state_of(target).units.get(unit)
    stale = state is not None and state.needs_reload
    return lambda: stale or changed()
