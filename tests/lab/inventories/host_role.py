"""Lab inventory for the host-role and profile tests: inventory/lab.py's nodes, each with extra role data.

$PVEGPU_LAB_EXTRA_DATA is a JSON object merged into every node's data (e.g.
`{"pve_host": {"allow_reboot": true}}`; a `node` object is merged into the node's data), validated like any
inventory, before pyinfra connects. As inventory/baremetal.py does, a `baremetal` node with `sglang` data
serves itself (group `baremetal_hosts`) from its model store (`model`); inventory/lab.py's containers are the
`lxc_guests`.
"""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import Any

from pvegpu.inventory.guests import exit_on_invalid_guests
from pvegpu.inventory.profiles import node_model_sglang
from pvegpu.inventory.validate import exit_on_invalid

_extra: dict[str, Any] = json.loads(os.environ.get("PVEGPU_LAB_EXTRA_DATA", "{}"))
# inventory/lab.py lists the serving guests of the profile in use.
os.environ["PVEGPU_PROFILE"] = _extra.get("node", {}).get("profile", "vm")
_lab = runpy.run_path(str(Path(__file__).resolve().parents[3] / "inventory/lab.py"))


def _merged(data: dict[str, Any]) -> dict[str, Any]:
    merged = {**data, **_extra}
    if isinstance(_extra.get("node"), dict):
        merged["node"] = {**data["node"], **_extra["node"]}
    if merged["node"]["profile"] == "baremetal" and "sglang" in merged:
        # As inventory/baremetal.py's `serving`: the node's model store serves it.
        merged["sglang"], problems = node_model_sglang(merged["sglang"], merged.get("model"), "baremetal")
        assert not problems, problems
    return merged


pve_nodes = exit_on_invalid([(name, _merged(data)) for name, data in _lab["pve_nodes"]])
baremetal_hosts = exit_on_invalid_guests(
    [(name, data) for name, data in pve_nodes if data["node"]["profile"] == "baremetal" and "sglang" in data]
)
lxc_guests = _lab.get("lxc_guests", [])
