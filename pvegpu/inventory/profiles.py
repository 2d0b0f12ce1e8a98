"""Alternate inventories by profile: the same hosts and specs as a base inventory, another `node.profile`.

`with_profile(hosts, "baremetal")` is what inventory/baremetal.py and inventory/lxc.py apply to
inventory.py's nodes, so a switch is `pyinfra inventory/baremetal.py deploy/site.py` with nothing else
declared twice. `serving(node_data, guest_data, profile)` is the data of whatever serves on that profile
(the node itself on `baremetal`, its container on `lxc`): the guest's `sglang`, the node's `driver` (the
container's userspace must be the host module's version) and GPUs. `node_model_sglang` gives any serving
host (these and `guests_of`'s VM guest) the node's model store (`model`): its repository and how the host
sees the store. Pure; the result is validated by the caller (`exit_on_invalid`, `exit_on_invalid_guests`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from pvegpu.inventory.validate import stop_on
from pvegpu.models.driver import DRIVER_KEY
from pvegpu.models.model import MODEL_KEY, HubSource, ModelSpec
from pvegpu.models.node import NODE_KEY
from pvegpu.models.sglang import SGLANG_KEY


def with_profile(
    hosts: Sequence[tuple[str, Mapping[str, Any]]], profile: str
) -> list[tuple[str, dict[str, Any]]]:
    """Copies of `hosts` (`(name, data)` entries) whose `node.profile` is `profile`; nothing else changes."""
    return [(name, {**data, NODE_KEY: {**data[NODE_KEY], "profile": profile}}) for name, data in hosts]


# The `sglang` keys that describe the node's model on a host that reads its store.
MODEL_SGLANG_KEYS = ("model_repo", "model_revision", "hf_endpoint", "hf_token_file", "model_share")
SHARE_OF_PROFILE = {"vm": "virtiofs", "lxc": "bind", "baremetal": "local"}


def serving(node_data: Mapping[str, Any], guest_data: Mapping[str, Any], profile: str) -> dict[str, Any]:
    """`node_data` plus what serving needs on `profile`: the guest's `sglang` (with the node's model store,
    `node_model_sglang`), the node's `driver`, and `node` with `profile` (the node's GPUs; the name stays
    the node's); on `lxc` (a container's data) without the node's `model`. SystemExit(2), after the problem
    lines on stderr, for `sglang` keys the node's `model` sets."""
    data: dict[str, Any] = {**node_data, NODE_KEY: {**node_data[NODE_KEY], "profile": profile}}
    if SGLANG_KEY in guest_data:
        sglang, problems = node_model_sglang(guest_data[SGLANG_KEY], node_data.get(MODEL_KEY), profile)
        stop_on([f"{node_data[NODE_KEY].get('name', '?')}: {line}" for line in problems])
        data[SGLANG_KEY] = sglang
    if DRIVER_KEY not in data and DRIVER_KEY in guest_data:
        data[DRIVER_KEY] = guest_data[DRIVER_KEY]
    if profile == "lxc":
        data.pop(MODEL_KEY, None)  # the node's: the container reads the store through mp0
    return data


def node_model_sglang(
    sglang: Mapping[str, Any], model: object, profile: str
) -> tuple[dict[str, Any], list[str]]:
    """`sglang` data of a host serving on `profile` from a node whose `model` data is `model`: with a valid
    `model`, the store's repository and revision (`model_repo`, ... : what the recipe and the completeness
    check read; the hub's address and token file for a VM guest's fallback fetch) and `model_share`; on
    `lxc` and `baremetal` `model_path` is the store's path (the container's `mp0` keeps the node's path).
    Without `model` (or an invalid one, which the node's own validation reports) `sglang` as it is.
    Problems: `sglang` keys the node's `model` sets."""
    data = dict(sglang)
    if model is None:
        return data, []
    try:
        spec = ModelSpec.model_validate(model)
    except ValidationError:
        return data, []
    problems = [
        f"{SGLANG_KEY}.{key}: set by the node's `{MODEL_KEY}` (declare the model once, on the node)"
        for key in MODEL_SGLANG_KEYS
        if data.get(key) is not None
    ]
    source = spec.source
    if isinstance(source, HubSource):
        data |= {
            "model_repo": source.repo,
            "model_revision": source.revision,
            "hf_endpoint": source.endpoint,
            "hf_token_file": source.token_file,
        }
    data["model_share"] = SHARE_OF_PROFILE[profile]
    if profile != "vm":
        data["model_path"] = spec.path
    return data, problems
