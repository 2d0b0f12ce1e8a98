"""Prometheus' node exporter (Debian's `prometheus-node-exporter`, listening on :9100 as Debian ships it),
pvegpu's textfiles for its textfile collector (pvegpu/plan/gauges.py) and the gauges timer that keeps the live
ones fresh, each decided from the host's one state read (`pvegpu.run.exporter.exporter_state`): a no-op run
sends no command of its own.

The timer (`pvegpu-gauges.timer`, every `INTERVAL_S`) runs `pvegpu-gauges.service` (Type=oneshot): on a
serving host with SGLang the script `GAUGES_SCRIPT` (SGLang's readiness probe, the run's own, into
`pvegpu_sglang.prom`); on a Proxmox node with the VM's pre-start hook (`vm.self_heal` `repair` or `check`) the
hook's bundle with `--gauges` (the VM's mappings as the hook would decide them, into `pvegpu_mappings.prom`).
The run writes the unit files and the script (templates/node_exporter/), never the files they write."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Generator

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.apt import noninteractive_apt

from pvegpu.facts.sglang import probe_command
from pvegpu.hook.bundle import BUNDLE_PATH, PYTHON
from pvegpu.models.exporter import (
    EXPORTER_PACKAGE,
    EXPORTER_SERVICE,
    GAUGES_SCRIPT,
    GAUGES_SERVICE_FILE,
    GAUGES_TIMER,
    GAUGES_TIMER_FILE,
    MAPPINGS_FILE,
    NODE_FILE,
    SERVING_FILE,
    SGLANG_FILE,
)
from pvegpu.models.sglang import ProbeTarget
from pvegpu.operations.files import temp_path, write_file
from pvegpu.operations.render import render
from pvegpu.plan.gauges import sglang_help
from pvegpu.plan.sglang_service import probe_target
from pvegpu.run.exporter import exporter_state
from pvegpu.run.gauges import node_gauges, serving_gauges
from pvegpu.run.plan import plan_of

INTERVAL_S = 30


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


def sglang_script(target: ProbeTarget, textfile: str = SGLANG_FILE) -> str:
    """The serving host's gauges script: SGLang's readiness probe at `target` into `textfile` (module
    docstring; `textfile` is for tests)."""
    names = list(sglang_help().items())
    format_ = "".join(
        f"# HELP {name} {text.replace('%', '%%')}\n# TYPE {name} gauge\n{name} %s\n" for name, text in names
    )
    return render(
        "node_exporter/pvegpu-sglang-gauges.sh.j2",
        base_url=target.base_url,
        textfile=textfile,
        textfile_sh=shlex.quote(textfile),
        temp_sh=shlex.quote(temp_path(textfile)),
        format_sh=shlex.quote(format_),
        probe=probe_command(target).get_raw_value(),
    )


def mappings_exec(vmid: int, prefix: str, owner: str, sysfs_root: str) -> str:
    """The node's check: the hook's bundle with `--gauges` for the VM `vmid`, quoted for systemd's
    ExecStart (which reads `%` as a specifier)."""
    argv = [PYTHON, BUNDLE_PATH, "--gauges", "--prefix", prefix, "--owner", owner, "--sysfs-root", sysfs_root]
    return shlex.join([*argv, str(vmid)]).replace("%", "%%")


def unit_files(what: str, textfile: str, exec_start: str) -> dict[str, str]:
    """The service and the timer, rendered."""
    service = render(
        "node_exporter/pvegpu-gauges.service.j2", what=what, textfile=textfile, exec_start=exec_start
    )
    timer = render("node_exporter/pvegpu-gauges.timer.j2", interval_s=INTERVAL_S)
    return {GAUGES_SERVICE_FILE: service, GAUGES_TIMER_FILE: timer}


def timer_files(*, serving: bool) -> dict[str, str]:
    """What the run writes for the host's timer (module docstring), path -> content; empty for a host that
    has none: a serving host without SGLang (yet), a node without the pre-start hook."""
    plan = plan_of(host)
    if serving:
        if plan.serving is None or not plan.serving.sglang:
            return {}
        exec_start = shlex.join(["/bin/sh", GAUGES_SCRIPT])
        script = {GAUGES_SCRIPT: sglang_script(probe_target(plan.specs.sglang))}
        return {**script, **unit_files("SGLang's readiness", SGLANG_FILE, exec_start)}
    vm = plan.vm
    if plan.steps is None or not plan.steps.vm or vm is None or vm.spec.self_heal == "off":
        return {}
    node = plan.specs.node
    exec_start = mappings_exec(vm.spec.vmid, vm.spec.mapping_prefix, plan.owner, str(node.sysfs_root))
    return unit_files(f"VM {vm.spec.vmid}'s GPU mappings' health", MAPPINGS_FILE, exec_start)


@operation()
def gauges_timer(*, serving: bool) -> Generator[StringCommand]:
    """The host's gauges timer (module docstring): each of its files written atomically (0644 root:root)
    when its sha256 differs, systemd's units reloaded when a unit file was or systemd says one is newer than
    what it loaded (a run that wrote it stopped before the reload), the timer started and enabled when it is
    not; nothing on a host without one or without systemd."""
    files = timer_files(serving=serving)
    if not files:
        what = (
            "SGLang on this host" if serving else "pre-start hook on this node (vm.self_heal off, or no VM)"
        )
        host.noop(f"no {GAUGES_TIMER} here: no {what}")
        return
    state = exporter_state(host)
    if not state.systemd:
        host.noop(f"no systemd on this host: {GAUGES_TIMER} is not started")
        return
    digests = {path: hashlib.sha256(content.encode()).hexdigest() for path, content in files.items()}
    changed = [path for path in files if state.sha256(path) != digests[path]]
    if not changed and state.timer_running and state.timer_enabled and not state.timer_needs_reload:
        host.noop(f"{GAUGES_TIMER} is running and enabled; {', '.join(files)} are pvegpu's")
        return
    for path in changed:
        yield write_file(path, files[path], mode="0644", owner="root:root")
    if state.timer_needs_reload or any(path != GAUGES_SCRIPT for path in changed):
        yield StringCommand("systemctl", "daemon-reload")
    if not state.timer_running:
        yield StringCommand("systemctl", "start", QuoteString(GAUGES_TIMER))
    if not state.timer_enabled:
        yield StringCommand("systemctl", "enable", QuoteString(GAUGES_TIMER))
