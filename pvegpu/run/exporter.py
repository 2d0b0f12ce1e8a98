"""`exporter_state(host)`: the node exporter on a host and pvegpu's textfiles there, from the host's one state
read: a Proxmox node's (pvegpu/run/node_state.py, its `exporter` part) while nothing changed on it since,
else read on its own (`ExporterRead`); any other host's (pvegpu/run/host_state.py, which reads again after a
change), whose request names the serving host's textfile, the gauges timer's files and its units. The
textfiles the timer writes are never read: they change at every check."""

from __future__ import annotations

from pyinfra.api.host import Host

from pvegpu.facts.exporter_read import ExporterRead
from pvegpu.models.exporter import (
    EXPORTER_PACKAGE,
    EXPORTER_SERVICE,
    GAUGES_SERVICE,
    GAUGES_TIMER,
    TEXTFILES,
    TIMER_FILES,
    ExporterState,
)
from pvegpu.models.groups import PVE_NODES
from pvegpu.run.host_state import state_of
from pvegpu.run.node_state import unchanged_node_state


def exporter_state(target: Host) -> ExporterState:
    """The exporter's package, unit and pvegpu's textfiles on `target` (module docstring)."""
    if PVE_NODES in target.groups:
        node = unchanged_node_state(target)
        if node is not None and node.exporter is not None:
            return node.exporter
        paths = (*TEXTFILES, *TIMER_FILES)
        return target.get_fact(ExporterRead, package=EXPORTER_PACKAGE, unit=EXPORTER_SERVICE, files=paths)
    state = state_of(target)
    unit, timer = state.units.get(EXPORTER_SERVICE), state.units.get(GAUGES_TIMER)
    timer_units = (state.units.get(name) for name in (GAUGES_TIMER, GAUGES_SERVICE))
    files = {
        path: state.paths[path].sha256 if state.paths[path].kind == "file" else None
        for path in (*TEXTFILES, *TIMER_FILES)
        if path in state.paths
    }
    return ExporterState(
        installed=EXPORTER_PACKAGE in state.packages,
        running=unit is not None and unit.running,
        enabled=unit is not None and unit.enabled,
        files=files,
        timer_running=timer is not None and timer.running,
        timer_enabled=timer is not None and timer.enabled,
        timer_needs_reload=any(unit is not None and unit.needs_reload for unit in timer_units),
    )
