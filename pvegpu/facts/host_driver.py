"""What the `lxc` / `baremetal` profiles left on a Proxmox host that loads or uses the NVIDIA driver at boot,
read in one command: pvegpu's files (modules-load drop-in, device unit, SGLang unit and env file) and the
state of the units that use the driver. The `vm` profile parks them (pvegpu/operations/host_driver.py)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.models.host_driver import HostDriverState, UnitState


class HostDriverFiles(FactBase[HostDriverState]):
    """Which of `files` exist and the state of each of `units` (pvegpu/plan/host_driver.py names them):
    `file <path>` for each file that exists; `unit <name> <UnitFileState> <ActiveState>` for each unit systemd
    reports (none without systemd)."""

    @override
    def command(self, files: Sequence[str], units: Sequence[str]) -> str:
        paths = " ".join(shlex.quote(path) for path in files)
        names = " ".join(shlex.quote(unit) for unit in units)
        # One `systemctl show` for all units (one systemctl each for is-enabled and is-active took most of the
        # node's state read); its blank-line separated blocks are printed as `unit <Id> <UnitFileState>
        # <ActiveState>`. Without systemd (a container without it) it prints nothing: no unit runs there.
        return (
            f'for f in {paths}; do [ -e "$f" ] && echo "file $f"; done; '
            f"systemctl show -p Id -p UnitFileState -p ActiveState -- {names} 2>/dev/null | "
            'awk -F= \'$1 == "Id" { id = $2 } $1 == "UnitFileState" { enabled = $2 } '
            '$1 == "ActiveState" { active = $2 } '
            '/^$/ { if (id != "") print "unit", id, enabled, active; id = enabled = active = "" } '
            'END { if (id != "") print "unit", id, enabled, active }\''
        )

    @override
    def process(self, output: list[str]) -> HostDriverState:
        return parse_host_driver(output)


def parse_host_driver(lines: Sequence[str]) -> HostDriverState:
    """Output of `HostDriverFiles().command(files, units)` -> HostDriverState. Pure."""
    files: list[str] = []
    units: list[UnitState] = []
    for line in lines:
        words = line.split()
        if words[:1] == ["file"] and len(words) == 2:
            files.append(words[1])
        elif words[:1] == ["unit"] and len(words) >= 2:
            states = words[2:]
            units.append(UnitState(words[1], enabled="enabled" in states, active="active" in states))
    return HostDriverState(files=tuple(files), units=tuple(units))
