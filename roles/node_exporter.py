"""node_exporter: Prometheus' node exporter (Debian's `prometheus-node-exporter`, on :9100 as Debian ships
it) kept installed, enabled and running, and pvegpu's gauges in its textfile directory
(pvegpu/plan/gauges.py: which file, which gauges, when each is written), and the timer that keeps the live
ones (SGLang ready, the mappings' health) fresh every 30 s. Last in a host's site run: the
values are what the run leaves (pvegpu/run/gauges.py). Every step decides from the host's one state read.
The exporter listens on :9100 on every address, as Debian ships it: the README shows the scrape config."""

from __future__ import annotations

from pyinfra.api.deploy import deploy

from pvegpu.operations.node_exporter import exporter_package, exporter_service, gauge_file, gauges_timer


@deploy("Export pvegpu's gauges to Prometheus")
def node_exporter(*, serving: bool) -> None:
    """The exporter, then the node's gauges (`serving` False) or the serving host's."""
    exporter_package(name="Install Prometheus' node exporter")
    exporter_service(name="Keep the node exporter enabled and running")
    gauge_file(name=f"Write the {'serving host' if serving else 'node'}'s gauges", serving=serving)
    gauges_timer(name="Keep the live gauges' timer installed, enabled and running", serving=serving)
