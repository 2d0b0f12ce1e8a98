"""`pyinfra INVENTORY deploy/guest.py`: the NVIDIA driver and the SGLang service on each serving host
(group `vm_guests`: the VMs' guests; roles/nvidia_driver.py, roles/sglang.py)."""

from pyinfra.context import host

from roles.nvidia_driver import nvidia_driver
from roles.sglang import sglang

if "vm_guests" in host.groups:
    nvidia_driver()
    sglang()
