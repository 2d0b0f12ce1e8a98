"""The node exporter's state on a host in a few lines, part of the node's one read (`node_read.NodeRead`'s
`exporter` part) and, after a change on the node, read on its own (`ExporterRead`): whether systemd runs
(`/run/systemd/system`, as sd_booted checks), the package as dpkg has it, the SubState and UnitFileState of
the exporter's unit and of pvegpu's gauges timer, whether systemd needs a reload for the timer or its
service, and the sha256 of each requested file (the run's textfiles, the timer's unit files and script).
One `systemctl show` for the three units (each call costs the host a systemctl process and systemd a D-Bus
call). Output lines:

    systemd
    package\\t<db:Status-Abbrev>\\t<version>
    unit\\tId=<unit> / ...SubState=, UnitFileState=, NeedDaemonReload=  a block per unit: the exporter's,
                            the timer's, its service's, separated by `unit\\t` (systemctl's blank line)
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
        "systemctl show --property Id --property SubState --property UnitFileState "
        f"--property NeedDaemonReload {shlex.quote(unit)} {GAUGES_TIMER} {GAUGES_SERVICE} 2>/dev/null "
        "| sed 's/^/unit\\t/' || true\n"
        f'set --; for f in {paths}; do printf "file\\t%s\\n" "$f"; '
        'if [ -f "$f" ]; then set -- "$@" "$f"; fi; done\n'
        'if [ $# -gt 0 ]; then sha256sum -- "$@"; fi; true'
    )


_PROPERTIES = ("Id", "SubState", "UnitFileState", "NeedDaemonReload")
_GAUGES_UNITS = (GAUGES_TIMER, GAUGES_SERVICE)


def parse_exporter(lines: Sequence[str]) -> ExporterState:
    """`exporter_command`'s output -> ExporterState."""
    systemd = installed = False
    blocks: list[dict[str, str]] = [{}]  # systemctl's block of each unit
    digests: dict[str, str | None] = {}
    for line in lines:
        fields = line.split("\t")
        if line == "systemd":
            systemd = True
        elif fields[0] == "package" and len(fields) == 3:
            installed = installed or (fields[1][:2] in _INSTALLED and bool(fields[2]))
        elif fields[0] == "unit" and len(fields) == 2 and not fields[1]:
            blocks.append({})  # the blank line between two units' blocks
        elif fields[0] == "unit" and len(fields) == 2 and fields[1].partition("=")[0] in _PROPERTIES:
            key, _, value = fields[1].partition("=")
            blocks[-1][key] = value
        elif fields[0] == "file" and len(fields) == 2 and fields[1].startswith("/"):
            digests[fields[1]] = None
        elif (match := _DIGEST.fullmatch(line)) and match[2] in digests:
            digests[match[2]] = match[1]
        elif line.strip():
            raise FactParseError(f"exporter: unexpected line {line!r}")
    # Each block by the Id systemctl names it with: pvegpu's two units, and the exporter's (whatever name
    # systemd gives it: an alias shows the unit it points to).
    gauges = {block["Id"]: block for block in blocks if block.get("Id") in _GAUGES_UNITS}
    exporter = next((block for block in blocks if block and block.get("Id") not in _GAUGES_UNITS), {})
    timer = gauges.get(GAUGES_TIMER, {})
    return ExporterState(
        installed,
        exporter.get("SubState", "") in RUNNING_SUBSTATES,
        exporter.get("UnitFileState", "") in ENABLED_STATES,
        systemd,
        digests,
        timer_running=timer.get("SubState", "") in RUNNING_SUBSTATES,
        timer_enabled=timer.get("UnitFileState", "") in ENABLED_STATES,
        timer_needs_reload=any(block.get("NeedDaemonReload") == "yes" for block in gauges.values()),
    )


class ExporterRead(FactBase[ExporterState]):
    """`host.get_fact(ExporterRead, package=..., unit=..., files=(...))` (module docstring)."""

    @override
    def command(self, package: str, unit: str, files: Sequence[str]) -> str:
        return exporter_command(package, unit, files)

    @override
    def process(self, output: list[str]) -> ExporterState:
        return parse_exporter(output)
