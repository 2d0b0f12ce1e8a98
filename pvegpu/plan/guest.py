"""Checks of a serving host's declared data that span several role keys; pure, run before connecting.

`check_guest(node, driver, sglang)` returns one `<key>.<field>: message` line per problem:
the driver flavour against the node's GPU ids, `tp_size x pp_size` against `node.gpus.count`, the full
`sglang serve` argv (with the profile's flags) against the pinned option table, and operator environment
variables and extra arguments the profile refuses. `pvegpu.inventory.guests.exit_on_invalid_guests` runs it
at inventory load.
"""

from __future__ import annotations

from pvegpu.models.driver import DriverSpec
from pvegpu.models.node import NodeSpec
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.driver import flavour_problems
from pvegpu.plan.errors import PlanError
from pvegpu.plan.nccl import plan_nccl
from pvegpu.plan.sglang import plan_sglang_argv, profile_problems


def check_guest(node: NodeSpec, driver: DriverSpec, sglang: SglangSpec) -> tuple[str, ...]:
    """Every cross-key problem of one serving host (see the module docstring); () when none."""
    problems = [*flavour_problems(driver, node.gpus.ids), *profile_problems(node.profile, sglang)]
    flags: tuple[str, ...] = ()
    if node.profile == "vm":
        try:
            flags = plan_nccl("vm", None, infiniband=False, overrides=sglang.env).argv
        except PlanError as error:
            problems.extend(str(error).splitlines())
    if node.gpus.count is not None:
        try:
            plan_sglang_argv(sglang, node.gpus.count, flags)
        except PlanError as error:
            problems.extend(str(error).splitlines())
    return tuple(problems)
