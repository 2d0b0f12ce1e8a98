"""What the lab tier reads of a host's node exporter (:9100), as Prometheus would, and the node's expected
gauges: the pre-start hook's verdict at the VM's last start and the gauges timer's live mapping check."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

from lab import hosts

METRICS = "http://127.0.0.1:9100/metrics"
REFERENCE_BUSES = ("41", "51", "61", "71", "c1", "d1", "e1", "f1")  # the reference topology's GPUs, in order


def ssh(host: hosts.LabHost, command: str) -> str:
    """`command`'s output in `host` (as root); it must succeed."""
    done = subprocess.run(
        hosts.ssh_argv(host, command), capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def scraped(host: hosts.LabHost) -> list[str]:
    """pvegpu's sample lines of `host`'s node exporter, fetched inside the host as Prometheus would."""
    fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{METRICS}').read().decode())\""
    done = subprocess.run(
        hosts.ssh_argv(host, fetch), capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "node_textfile_scrape_error 0" in done.stdout.splitlines(), done.stdout  # every file parsed
    return [line for line in done.stdout.splitlines() if line.startswith("pvegpu_")]


def refresh(host: hosts.LabHost) -> None:
    """One run of `host`'s gauges timer's service now (Type=oneshot: `start` returns when it finished)."""
    ssh(host, "systemctl start pvegpu-gauges.service")


def assert_node_gauges(
    lines: Sequence[str], name: str, buses: Sequence[str], *, hook: str, result: str
) -> None:
    """Node `name`'s pvegpu lines (`scraped`) are VM 100's: the hook's start time, each GPU at `buses` as the
    hook left it (`hook`: its status), its `result`, the start allowed; then the timer's check time and each
    GPU valid at `buses` now."""
    vm = f'node="{name}",vmid="100"'
    stamp = rf"pvegpu_hook_last_run_timestamp_seconds\{{{re.escape(vm)}\}} [0-9.]+e\+09"
    assert re.fullmatch(stamp, lines[0]), lines  # the start's time, as the exporter prints it
    checked = rf"pvegpu_mapping_checked_timestamp_seconds\{{{re.escape(vm)}\}} [0-9.]+e\+09"
    assert re.fullmatch(checked, lines[11]), lines
    assert [*lines[1:11], *lines[12:]] == [
        *(
            f'pvegpu_hook_mapping_healthy{{mapping="gpu{n}",node="{name}",path="0000:{bus}:00",'
            f'status="{hook}",vmid="100"}} 1'
            for n, bus in enumerate(buses)
        ),
        f'pvegpu_hook_result{{node="{name}",result="{result}",vmid="100"}} 1',
        f"pvegpu_hook_start_allowed{{{vm}}} 1",
        *(
            f'pvegpu_mapping_healthy{{mapping="gpu{n}",node="{name}",path="0000:{bus}:00",status="valid",'
            'vmid="100"} 1'
            for n, bus in enumerate(buses)
        ),
    ]
