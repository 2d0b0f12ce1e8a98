"""Alternate inventories by profile: the same hosts and specs as a base inventory, another `node.profile`.

`with_profile(hosts, "baremetal")` is what inventory/baremetal.py and inventory/lxc.py apply to
inventory.py's nodes, so a switch is `pyinfra inventory/baremetal.py deploy/site.py` with nothing else
declared twice. Pure; the result is validated by the caller (`exit_on_invalid`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pvegpu.models.inventory import NODE_KEY


def with_profile(
    hosts: Sequence[tuple[str, Mapping[str, Any]]], profile: str
) -> list[tuple[str, dict[str, Any]]]:
    """Copies of `hosts` (`(name, data)` entries) whose `node.profile` is `profile`; nothing else changes."""
    return [(name, {**data, NODE_KEY: {**data[NODE_KEY], "profile": profile}}) for name, data in hosts]
