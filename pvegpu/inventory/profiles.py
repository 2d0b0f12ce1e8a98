"""Alternate inventories by profile: the same hosts and specs as a base inventory, another `node.profile`.

`with_profile(hosts, "baremetal")` is what inventory/baremetal.py and inventory/lxc.py apply to
inventory.py's nodes, so a switch is `pyinfra inventory/baremetal.py deploy/site.py` with nothing else
declared twice. `serving(node_data, guest_data, profile)` is the data of whatever serves on that profile
(the node itself on `baremetal`, its container on `lxc`): the guest's `sglang`, the node's `driver` (the
container's userspace must be the host module's version) and GPUs. Pure; the result is validated by the
caller (`exit_on_invalid`, `exit_on_invalid_guests`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pvegpu.models.driver import DRIVER_KEY
from pvegpu.models.node import NODE_KEY
from pvegpu.models.sglang import SGLANG_KEY


def with_profile(
    hosts: Sequence[tuple[str, Mapping[str, Any]]], profile: str
) -> list[tuple[str, dict[str, Any]]]:
    """Copies of `hosts` (`(name, data)` entries) whose `node.profile` is `profile`; nothing else changes."""
    return [(name, {**data, NODE_KEY: {**data[NODE_KEY], "profile": profile}}) for name, data in hosts]


def serving(node_data: Mapping[str, Any], guest_data: Mapping[str, Any], profile: str) -> dict[str, Any]:
    """`node_data` plus what serving needs on `profile`: the guest's `sglang`, the node's `driver`, and
    `node` with `profile` (the node's GPUs; the name stays the node's)."""
    data: dict[str, Any] = {**node_data, NODE_KEY: {**node_data[NODE_KEY], "profile": profile}}
    if SGLANG_KEY in guest_data:
        data[SGLANG_KEY] = guest_data[SGLANG_KEY]
    if DRIVER_KEY not in data and DRIVER_KEY in guest_data:
        data[DRIVER_KEY] = guest_data[DRIVER_KEY]
    return data
