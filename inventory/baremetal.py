"""inventory.py's nodes with profile `baremetal`: the host itself serves, on its own NVIDIA driver, with GPU
peer-to-peer. `pyinfra inventory/baremetal.py deploy/site.py` is the whole switch: the VM stopped with
`onboot: 0`, the vfio binding, nvidia blacklist and `<vendor>_iommu=on` removed (`iommu=pt` kept), reboot
when allowed (`pve_host.allow_reboot`), then the driver and SGLang on the host (group `baremetal_hosts`).
`pyinfra inventory.py deploy/site.py` switches back.
"""

import runpy
from pathlib import Path

from pvegpu.models.inventory import exit_on_invalid
from pvegpu.profile_inventory import with_profile

_base = runpy.run_path(str(Path(__file__).resolve().parents[1] / "inventory.py"))

pve_nodes = exit_on_invalid(with_profile(_base["pve_nodes"], "baremetal"))
# The nodes serve themselves: deploy/site.py runs the driver and SGLang roles on this group.
baremetal_hosts = pve_nodes
