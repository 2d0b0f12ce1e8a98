"""inventory.py's nodes with profile `lxc`: SGLang in an LXC container on the host's NVIDIA driver, with GPU
peer-to-peer as on bare metal. `pyinfra inventory/lxc.py deploy/site.py` is the whole switch: the VM
stopped with `onboot: 0`, the vfio binding, nvidia blacklist and `<vendor>_iommu=on` removed (`iommu=pt`
kept), reboot when allowed (`pve_host.allow_reboot`), then the container (`lxc` below) created or
converged with a device entry per GPU and started. `pyinfra inventory.py deploy/site.py` switches back.
"""

import runpy
from pathlib import Path

from pvegpu.models.inventory import exit_on_invalid
from pvegpu.profile_inventory import with_profile

_base = runpy.run_path(str(Path(__file__).resolve().parents[1] / "inventory.py"))

# The container, unless inventory.py declares it (declare it there: switching back to `vm` then stops it):
# set the template your node has (`pveam list local`).
CONTAINER = {"vmid": 200, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"}

pve_nodes = exit_on_invalid(
    [(name, {"lxc": CONTAINER, **data}) for name, data in with_profile(_base["pve_nodes"], "lxc")]
)
