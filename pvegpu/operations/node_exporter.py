"""Prometheus' node exporter (Debian's `prometheus-node-exporter`, listening on :9100 as Debian ships it) and
pvegpu's textfiles for its textfile collector (pvegpu/plan/gauges.py), each decided from the host's one state
read (`pvegpu.run.exporter.exporter_state`): a no-op run sends no command of its own."""

from __future__ import annotations

import hashlib
from collections.abc import Generator

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.apt import noninteractive_apt

from pvegpu.models.exporter import EXPORTER_PACKAGE, EXPORTER_SERVICE, NODE_FILE, SERVING_FILE
from pvegpu.operations.files import write_file
from pvegpu.run.exporter import exporter_state
from pvegpu.run.gauges import node_gauges, serving_gauges


@operation()
def exporter_package() -> Generator[str]:
    """The exporter's package installed (apt, as pyinfra's apt.packages installs one), without its
    Recommends (`prometheus-node-exporter-collectors`: timers that run smartctl, ipmitool and apt on the host;
    an operator who wants them installs them)."""
    if exporter_state(host).installed:
        host.noop(f"package {EXPORTER_PACKAGE} is installed")
        return
    yield f"{noninteractive_apt('install --no-install-recommends')} {EXPORTER_PACKAGE}"


@operation()
def exporter_service() -> Generator[StringCommand]:
    """The exporter's unit running and enabled; nothing on a host without systemd (a lab container)."""
    state = exporter_state(host)
    if not state.systemd:
        host.noop(f"no systemd on this host: {EXPORTER_SERVICE} is not started")
        return
    if state.running and state.enabled:
        host.noop(f"{EXPORTER_SERVICE} is running and enabled")
        return
    if not state.running:
        yield StringCommand("systemctl", "start", QuoteString(EXPORTER_SERVICE))
    if not state.enabled:
        yield StringCommand("systemctl", "enable", QuoteString(EXPORTER_SERVICE))


@operation()
def gauge_file(*, serving: bool) -> Generator[StringCommand]:
    """pvegpu's textfile of the host (`serving`: the serving host's, else the node's) holds its gauges, as
    this run leaves the host (pvegpu/run/gauges.py, computed when the operation runs), written atomically
    (0644 root:root) when its sha256 differs; the exporter's package made the directory."""
    path = SERVING_FILE if serving else NODE_FILE
    content = serving_gauges(host) if serving else node_gauges(host)
    if exporter_state(host).sha256(path) == hashlib.sha256(content.encode()).hexdigest():
        host.noop(f"{path} holds the gauges")
        return
    yield write_file(path, content, mode="0644", owner="root:root")
