"""The node exporter's state on a host in a few lines, part of the node's one read (`node_read.NodeRead`'s
`exporter` part) and, after a change on the node, read on its own (`ExporterRead`): whether systemd runs
(`/run/systemd/system`, as sd_booted checks), the package as dpkg has it, the unit's SubState and
UnitFileState, those of pvegpu's gauges timer, whether systemd needs a reload for the timer or its service,
and the sha256 of each requested file (the run's textfiles, the timer's unit files and script). Output lines:

    systemd
    package\\t<db:Status-Abbrev>\\t<version>
    unit\\tSubState=<state> / unit\\tUnitFileState=<state>
    timer\\tId=<unit> / ...SubState=, UnitFileState=, NeedDaemonReload=  a block per unit: the timer's,
                            then its service's, separated by `timer\\t` (systemctl's blank line)
    file\t<path>            per requested file; then `<sha256>  <path>` for each that is a file (one
                            sha256sum for all)

`parse_exporter` is pure; FactParseError names a line of another shape.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.host_read import ENABLED_STATES, RUNNING_SUBSTATES
from pvegpu.models.exporter import GAUGES_SERVICE, GAUGES_TIMER, ExporterState

_DIGEST = re.compile(r"([0-9a-f]{64})  (/.*)")
_INSTALLED = ("ii", "hi")  # as host_read reads dpkg's status


def exporter_command(package: str, unit: str, files: Sequence[str]) -> str:
    """The POSIX-sh lines (module docstring); exits 0 whatever it finds."""
    paths = " ".join(shlex.quote(path) for path in files)
    return (
        "if [ -d /run/systemd/system ]; then echo systemd; fi\n"
        f"dpkg-query -W -f='package\\t${{db:Status-Abbrev}}\\t${{Version}}\\n' {shlex.quote(package)} "
        "2>/dev/null || true\n"
        f"systemctl show --property SubState --property UnitFileState {shlex.quote(unit)} 2>/dev/null "
        "| sed 's/^/unit\\t/' || true\n"
        "systemctl show --property Id --property SubState --property UnitFileState "
        f"--property NeedDaemonReload {GAUGES_TIMER} {GAUGES_SERVICE} 2>/dev/null | sed 's/^/timer\\t/' "
        "|| true\n"
        f'set --; for f in {paths}; do printf "file\\t%s\\n" "$f"; '
        'if [ -f "$f" ]; then set -- "$@" "$f"; fi; done\n'
        'if [ $# -gt 0 ]; then sha256sum -- "$@"; fi; true'
    )


_TIMER_PROPERTIES = ("Id", "SubState", "UnitFileState", "NeedDaemonReload")


def parse_exporter(lines: Sequence[str]) -> ExporterState:
    """`exporter_command`'s output -> ExporterState."""
    systemd = installed = running = enabled = False
    timer_blocks: list[dict[str, str]] = [{}]  # systemctl's blocks of the timer and its service
    digests: dict[str, str | None] = {}
    for line in lines:
        fields = line.split("\t")
        if line == "systemd":
            systemd = True
        elif fields[0] == "package" and len(fields) == 3:
            installed = installed or (fields[1][:2] in _INSTALLED and bool(fields[2]))
        elif fields[0] == "unit" and len(fields) == 2 and fields[1].startswith("SubState="):
            running = fields[1].partition("=")[2] in RUNNING_SUBSTATES
        elif fields[0] == "unit" and len(fields) == 2 and fields[1].startswith("UnitFileState="):
            enabled = fields[1].partition("=")[2] in ENABLED_STATES
        elif fields[0] == "timer" and len(fields) == 2 and not fields[1]:
            timer_blocks.append({})  # the blank line between two units' blocks
        elif fields[0] == "timer" and len(fields) == 2 and fields[1].partition("=")[0] in _TIMER_PROPERTIES:
            key, _, value = fields[1].partition("=")
            timer_blocks[-1][key] = value
        elif fields[0] == "file" and len(fields) == 2 and fields[1].startswith("/"):
            digests[fields[1]] = None
        elif (match := _DIGEST.fullmatch(line)) and match[2] in digests:
            digests[match[2]] = match[1]
        elif line.strip() and not (fields[0] == "unit" and len(fields) == 2 and not fields[1]):
            raise FactParseError(f"exporter: unexpected line {line!r}")
    # The timer's block is the one systemctl names it in; a read of the timer alone (no Id) has one block.
    timer = next((block for block in timer_blocks if block.get("Id") == GAUGES_TIMER), timer_blocks[0])
    return ExporterState(
        installed,
        running,
        enabled,
        systemd,
        digests,
        timer_running=timer.get("SubState", "") in RUNNING_SUBSTATES,
        timer_enabled=timer.get("UnitFileState", "") in ENABLED_STATES,
        timer_needs_reload=any(block.get("NeedDaemonReload") == "yes" for block in timer_blocks),
    )


class ExporterRead(FactBase[ExporterState]):
    """`host.get_fact(ExporterRead, package=..., unit=..., files=(...))` (module docstring)."""

    @override
    def command(self, package: str, unit: str, files: Sequence[str]) -> str:
        return exporter_command(package, unit, files)

    @override
    def process(self, output: list[str]) -> ExporterState:
        return parse_exporter(output)
