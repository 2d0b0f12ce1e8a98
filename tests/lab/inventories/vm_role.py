"""Lab inventory for the VM-role tests: inventory/lab.py's Proxmox nodes, each VM with extra data, and the
VMs' guests as inventory/lab.py lists them.

$PVEGPU_LAB_VM_DATA is a JSON object merged into every node's `vm` (e.g. `{"self_heal": "off"}`: a test that
wants Proxmox's own start failure after a BIOS change, not the pre-start hook's repair); validated like any
inventory, before pyinfra connects. The keys it may set do not change what guests_of derives from the VM.
"""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import Any

from pvegpu.inventory.validate import exit_on_invalid

_lab = runpy.run_path(str(Path(__file__).resolve().parents[3] / "inventory/lab.py"))
_extra: dict[str, Any] = json.loads(os.environ.get("PVEGPU_LAB_VM_DATA", "{}"))


def _merged(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "vm": {**data["vm"], **_extra}} if "vm" in data else data


pve_nodes = exit_on_invalid([(name, _merged(data)) for name, data in _lab["pve_nodes"]])
vm_guests = _lab["vm_guests"]
