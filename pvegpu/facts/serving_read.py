"""`ServingRead`: a serving host's PCI hardware and its state (`host_read.HostRead`) in ONE command, for a
host outside `pve_nodes` whose plan and state are both needed before its operations (a VM guest, a container,
a bare-metal host): one round trip instead of the hardware's and then the state's.

The output is ONE line (`parsing.PACK`: a VM guest's PCI attributes and package list are a thousand lines,
which pyinfra reads one at a time) packing the hardware listing (`hardware_parse.hardware_command`), a line
`#pvegpu-serving:state`, then the state read's sections. A hardware listing that fails (a sysfs root that
is not a directory) fails the whole read with its message, as `PciHardware` does; each half is parsed by its
own pure parser.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError, fact_errors
from pvegpu.facts.hardware import hardware_command, parse_hardware
from pvegpu.facts.host_read import HostState, StateRequest, parse_state, state_command, targeted
from pvegpu.facts.parsing import PACK, unpacked
from pvegpu.models.hardware import HostHardware

STATE_MARKER = "#pvegpu-serving:state"


@dataclass(frozen=True)
class ServingState:
    """The read's two halves."""

    hardware: HostHardware
    state: HostState


def serving_read_command(sysfs_root: str, request: StateRequest) -> str:
    """The one POSIX-sh command: the hardware listing (its failure exits with its status), the marker, the
    state read, packed. `$(...)` keeps the listing's exit status (a pipe would give gzip's)."""
    read = f"( {hardware_command(sysfs_root)}\n) || exit $?\necho {shlex.quote(STATE_MARKER)}\n" + (
        state_command(request)
    )
    return f"pvegpu_read=$(\n{read}\n) || exit $?\nprintf '%s\\n' \"$pvegpu_read\" | {PACK}\necho"


def parse_serving_read(lines: Sequence[str]) -> ServingState:
    """The read's output -> ServingState. Pure; FactParseError when the marker is missing or a half does
    not parse."""
    if STATE_MARKER not in lines:
        raise FactParseError(f"serving read: truncated output, the {STATE_MARKER} marker is missing")
    split = list(lines).index(STATE_MARKER)
    return ServingState(parse_hardware(lines[:split]), parse_state(lines[split + 1 :]))


class ServingRead(FactBase[ServingState]):
    """`host.get_fact(ServingRead, sysfs_root=..., request=StateRequest(...))` (module docstring). Read it
    through `pvegpu.run.host_state.read_serving_host`, which shares it with the plan and the operations."""

    # The state's request, for `process`: pyinfra calls `command` and `process` on one instance.
    request: StateRequest | None = None

    @override
    def command(self, sysfs_root: str, request: StateRequest) -> str:
        self.request = request
        return serving_read_command(sysfs_root, request)

    @override
    def process(self, output: list[str]) -> ServingState:
        read = parse_serving_read(fact_errors(unpacked)(output, "serving read"))
        return ServingState(read.hardware, targeted(read.state, self.request))
