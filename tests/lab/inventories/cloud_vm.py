"""Lab inventory for the cloud-image tests: inventory/lab.py's Proxmox nodes, each VM with extra data, and the
guests `guests_of` derives from those nodes (as inventory.py does: a DHCP guest joins once its address is
recorded).

$PVEGPU_LAB_VM_DATA is a JSON object merged into every node's `vm` (e.g. `{"ipconfig": "ip=dhcp"}` or an
`image` with another checksum); validated like any inventory, before pyinfra connects.
"""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import Any

from lab.hosts import SYSFS_ROOT
from pvegpu.inventory.guests import guests_of
from pvegpu.inventory.validate import exit_on_invalid

_lab = runpy.run_path(str(Path(__file__).resolve().parents[3] / "inventory/lab.py"))
_extra: dict[str, Any] = json.loads(os.environ.get("PVEGPU_LAB_VM_DATA", "{}"))

pve_nodes = exit_on_invalid(
    [(name, {**data, "vm": {**data["vm"], **_extra}}) for name, data in _lab["pve_nodes"]]
)
vm_guests = guests_of(pve_nodes, {**_lab["GUEST_DATA"], "node": {"sysfs_root": SYSFS_ROOT["nspawn"]}})
