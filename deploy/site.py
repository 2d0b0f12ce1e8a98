"""`pyinfra INVENTORY deploy/site.py`: every step of the inventory's profile, in order; run with another
profile's inventory (`inventory/baremetal.py`, `inventory/lxc.py`) it is the switch, undoing the old one.

Proxmox nodes (`pve_nodes`); the guest of a profile not in use is stopped with `onboot: 0` first (the
`lxc` container when the host has `lxc` data, the VM when it has `vm` data):
- `vm`: host prepared (vfio binding, reboot if allowed), PCI mappings from the live IOMMU groups, the Q35
  VM converged (`onboot: 1`) and started once the binding is in effect.
- `lxc` / `baremetal`: the managed VM stopped and `onboot: 0` first (it lets go of the GPUs), then the host
  prepared for its own driver (vfio binding and nvidia blacklist removed, reboot if allowed); `lxc`: then
  the container with the GPU device entries, started, its driver checked against the host's module.
Serving hosts (`vm_guests`, `baremetal_hosts`): the NVIDIA driver and the SGLang service.
"""

from pyinfra.context import host

from roles.lxc_gpu import lxc_gpu, lxc_gpu_parked
from roles.nvidia_driver import nvidia_driver
from roles.pci_mapping import node_of, pci_mapping
from roles.pve_host import pve_host
from roles.q35_vm import q35_vm_parked, q35_vm_role
from roles.sglang import sglang

if "pve_nodes" in host.groups:
    profile = node_of(host).profile
    # The old profile's guest lets go of the GPUs before the host rebinds them.
    if profile != "lxc":
        lxc_gpu_parked()
    if profile != "vm":
        q35_vm_parked()
    pve_host()
    if profile == "vm":
        pci_mapping()
        q35_vm_role()
    if profile == "lxc":
        lxc_gpu()
if "vm_guests" in host.groups or "baremetal_hosts" in host.groups:
    nvidia_driver()
    sglang()
