"""`pyinfra INVENTORY deploy/guest.py`: the NVIDIA driver and the SGLang service on each serving guest:
group `vm_guests` (the VMs' guests: the driver with its module) and `lxc_guests` (containers: userspace
only, at the host module's version); roles/nvidia_driver.py, roles/sglang.py. A bare-metal host's driver
and service come with deploy/site.py."""

from pyinfra.context import host

from roles.nvidia_driver import nvidia_driver
from roles.sglang import sglang

if "vm_guests" in host.groups:
    nvidia_driver()
    sglang()
if "lxc_guests" in host.groups:
    nvidia_driver(placement="container")
    sglang()
