"""inventory.py's nodes with profile `lxc`: SGLang in an LXC container on the host's NVIDIA driver, with GPU
peer-to-peer as on bare metal. `pyinfra inventory/lxc.py deploy/site.py` is the whole switch: the VM
stopped with `onboot: 0`, the vfio binding, nvidia blacklist and `<vendor>_iommu=on` removed (`iommu=pt`
kept), reboot when allowed (`pve_host.allow_reboot`), the host driver with its module built for the
Proxmox kernel and the device nodes made at boot, then the container (`lxc` below) created or converged
with a device entry per GPU and started. Once the container answers SSH (the second run), its userspace
driver at the host module's version and SGLang (group `lxc_guests`). `pyinfra inventory.py
deploy/site.py` switches back.
"""

import runpy
from pathlib import Path
from typing import Any

from pvegpu.inventory.guests import exit_on_invalid_guests
from pvegpu.inventory.profiles import serving, with_profile
from pvegpu.inventory.validate import exit_on_invalid

_base = runpy.run_path(str(Path(__file__).resolve().parents[1] / "inventory.py"))
_guest = _base["SERVING"]

# The container, unless inventory.py declares it (declare it there: switching back to `vm` then stops it):
# set the template your node has (`pveam list local`).
CONTAINER = {"vmid": 200, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"}

pve_nodes = exit_on_invalid(
    [(name, {"lxc": CONTAINER, **data}) for name, data in with_profile(_base["pve_nodes"], "lxc")]
)


# The container as a serving host: its address (DHCP on vmbr0; give it a DNS name or a static ip), SSH as
# inventory.py's hosts (root, host key checked strictly), the node's GPUs and driver (its userspace must be
# the host module's version), the guest's SGLang.
def _container(node_data: dict[str, Any]) -> dict[str, Any]:
    shared = {key: value for key, value in node_data.items() if key in ("node", "driver", "model")}
    return {**serving(shared, _guest, "lxc"), **_base["SSH"]}


lxc_guests = exit_on_invalid_guests([("llm-ct.example.net", _container(data)) for _, data in pve_nodes])
