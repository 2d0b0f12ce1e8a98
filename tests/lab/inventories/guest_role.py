"""Lab inventory for the guest-role tests: inventory/lab.py's VM guests, each with extra role data.

$PVEGPU_LAB_EXTRA_DATA is a JSON object whose keys (`node`, `driver`, `sglang`) are merged into each guest's
data of the same key (e.g. `{"sglang": {"mem_fraction_static": 0.85}}`); validated like any serving-host
inventory, before pyinfra connects. $PVEGPU_LAB_HOST_DATA (`{"<guest>": {"sglang": {...}}}`) is merged after
it into the named guest's data alone (e.g. each rank of a multi-node layout).
"""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import Any

from pvegpu.inventory.guests import exit_on_invalid_guests

_lab = runpy.run_path(str(Path(__file__).resolve().parents[3] / "inventory/lab.py"))
_extra: dict[str, Any] = json.loads(os.environ.get("PVEGPU_LAB_EXTRA_DATA", "{}"))
_per_host: dict[str, dict[str, Any]] = json.loads(os.environ.get("PVEGPU_LAB_HOST_DATA", "{}"))


def _merged(data: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    return {**data, **{key: {**data.get(key, {}), **value} for key, value in extra.items()}}


vm_guests = exit_on_invalid_guests(
    [(name, _merged(_merged(data, _extra), _per_host.get(name, {}))) for name, data in _lab["vm_guests"]]
)
