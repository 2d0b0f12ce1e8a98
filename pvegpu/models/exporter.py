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
# The live gauges: a systemd timer runs a check every 30 s that writes its own textfile (never read by a run:
# it changes at every check). On a serving host SGLang's readiness probe (`SGLANG_FILE`, the script
# `GAUGES_SCRIPT`); on a Proxmox node with the pre-start hook the hook's bundle in `--gauges` mode
# (`MAPPINGS_FILE`). One unit name per host: a node with the hook (`vm`) serves nothing itself.
SGLANG_FILE = f"{TEXTFILE_DIR}/pvegpu_sglang.prom"
MAPPINGS_FILE = f"{TEXTFILE_DIR}/pvegpu_mappings.prom"
GAUGES_SERVICE = "pvegpu-gauges.service"
GAUGES_TIMER = "pvegpu-gauges.timer"
GAUGES_SERVICE_FILE = f"/etc/systemd/system/{GAUGES_SERVICE}"
GAUGES_TIMER_FILE = f"/etc/systemd/system/{GAUGES_TIMER}"
GAUGES_SCRIPT = "/usr/local/sbin/pvegpu-sglang-gauges"
TIMER_FILES = (GAUGES_SCRIPT, GAUGES_SERVICE_FILE, GAUGES_TIMER_FILE)  # what the run writes for the timer


@dataclass(frozen=True)
class ExporterState:
    """`installed`: dpkg has the exporter's package installed; `running` / `enabled`: its unit, as pyinfra
    reads systemd's states; `systemd`: the host runs systemd (a container without it has no unit to start);
    `files`: the sha256 of each of pvegpu's textfiles and `TIMER_FILES` the read looked for (None: no such
    file); `timer_running` / `timer_enabled`: `GAUGES_TIMER`'s states, read alike; `timer_needs_reload`:
    the timer's or its service's unit file is newer than what systemd loaded (a run wrote it and stopped
    before reloading the units)."""

    installed: bool
    running: bool
    enabled: bool
    systemd: bool = True
    files: Mapping[str, str | None] = field(default_factory=dict)
    timer_running: bool = False
    timer_enabled: bool = False
    timer_needs_reload: bool = False

    def sha256(self, path: str) -> str | None:
        """The sha256 of textfile `path` (None: no such file). KeyError for a path the read did not look
        for: deciding from a read that never looked would rewrite the file on every run."""
        if path not in self.files:
            raise KeyError(f"{path} is not in the host's state read (pvegpu.run.exporter)")
        return self.files[path]
