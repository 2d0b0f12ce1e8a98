"""Inventory-time validation of serving hosts (VM guests, containers, bare-metal hosts).

`exit_on_invalid_guests(hosts)` is `exit_on_invalid` plus the cross-key checks of `pvegpu.plan.guest`, so
an unknown SGLang flag, a layout that does not fit the GPUs or a driver below the floor stops pyinfra with
exit status 2 and `<host>: <key>.<field>: message` lines, before it connects anywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.inventory import NODE_KEY, H, NodeSpec, exit_on_invalid, spec_of
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.plan.guest import check_guest


def exit_on_invalid_guests(hosts: H) -> H:
    """Return `hosts` unchanged if valid; else print every problem line to stderr and exit with status 2."""
    exit_on_invalid(hosts)
    problems: list[str] = []
    for entry in hosts:
        if isinstance(entry, str) or not isinstance(entry[1], Mapping):
            continue
        name, data = entry[0], entry[1]
        problems.extend(
            f"{name}: {problem}"
            for problem in check_guest(
                spec_of(data, NODE_KEY, NodeSpec),
                spec_of(data, DRIVER_KEY, DriverSpec),
                spec_of(data, SGLANG_KEY, SglangSpec),
            )
        )
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        raise SystemExit(2)
    return hosts
