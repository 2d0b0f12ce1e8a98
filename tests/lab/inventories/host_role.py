"""Lab inventory for the host-role tests: inventory/lab.py's nodes, each with extra role data.

$PVEGPU_LAB_EXTRA_DATA is a JSON object merged into every host's data (e.g.
`{"pve_host": {"allow_reboot": true}}`; a `node` object is merged into the node's data), validated like any
inventory, before pyinfra connects.
"""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import Any

from pvegpu.models.inventory import exit_on_invalid

_lab = runpy.run_path(str(Path(__file__).resolve().parents[3] / "inventory/lab.py"))
_extra: dict[str, Any] = json.loads(os.environ.get("PVEGPU_LAB_EXTRA_DATA", "{}"))


def _merged(data: dict[str, Any]) -> dict[str, Any]:
    merged = {**data, **_extra}
    if isinstance(_extra.get("node"), dict):
        merged["node"] = {**data["node"], **_extra["node"]}
    return merged


pve_nodes = exit_on_invalid([(name, _merged(data)) for name, data in _lab["pve_nodes"]])
