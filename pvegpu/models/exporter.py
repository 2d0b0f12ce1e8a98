"""The node exporter on a host, as pvegpu's one state read of the host shows it. Plain frozen data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Debian's package and unit; its default `--collector.textfile.directory`, where pvegpu's files go
# (pvegpu/plan/gauges.py says which and when).
EXPORTER_PACKAGE = "prometheus-node-exporter"
EXPORTER_SERVICE = "prometheus-node-exporter.service"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
NODE_FILE = f"{TEXTFILE_DIR}/pvegpu_node.prom"
SERVING_FILE = f"{TEXTFILE_DIR}/pvegpu_serving.prom"
HOOK_FILE = f"{TEXTFILE_DIR}/pvegpu_hook.prom"
TEXTFILES = (NODE_FILE, SERVING_FILE)  # the runs' files (the hook's is the hook's alone)


@dataclass(frozen=True)
class ExporterState:
    """`installed`: dpkg has the exporter's package installed; `running` / `enabled`: its unit, as pyinfra
    reads systemd's states; `systemd`: the host runs systemd (a container without it has no unit to start);
    `files`: the sha256 of each of pvegpu's textfiles the read looked for (None: no such file)."""

    installed: bool
    running: bool
    enabled: bool
    systemd: bool = True
    files: Mapping[str, str | None] = field(default_factory=dict)

    def sha256(self, path: str) -> str | None:
        """The sha256 of textfile `path` (None: no such file). KeyError for a path the read did not look
        for: deciding from a read that never looked would rewrite the file on every run."""
        if path not in self.files:
            raise KeyError(f"{path} is not in the host's state read (pvegpu.run.exporter)")
        return self.files[path]
