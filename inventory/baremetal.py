"""inventory.py's nodes with profile `baremetal`: the host itself serves, on its own NVIDIA driver, with GPU
peer-to-peer. `pyinfra inventory/baremetal.py deploy/site.py` is the whole switch: the VM stopped with
`onboot: 0`, the vfio binding, nvidia blacklist and `<vendor>_iommu=on` removed (`iommu=pt` kept), reboot
when allowed (`pve_host.allow_reboot`), the driver with its module built for the Proxmox kernel (reboot
when `driver.allow_reboot`), then SGLang on the host (group `baremetal_hosts`) with inventory.py's guest's
`sglang` data. `pyinfra inventory.py deploy/site.py` switches back.
"""

import runpy
from pathlib import Path

from pvegpu.inventory.guests import exit_on_invalid_guests
from pvegpu.inventory.profiles import serving
from pvegpu.inventory.validate import exit_on_invalid

_base = runpy.run_path(str(Path(__file__).resolve().parents[1] / "inventory.py"))
_guest = _base["SERVING"]

pve_nodes = exit_on_invalid([(name, serving(data, _guest, "baremetal")) for name, data in _base["pve_nodes"]])
# The nodes serve themselves: deploy/site.py runs SGLang on this group.
baremetal_hosts = exit_on_invalid_guests(pve_nodes)
