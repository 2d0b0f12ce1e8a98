"""`pyinfra INVENTORY deploy/site.py`: every step of the inventory's profile, in order; run with another
profile's inventory (`inventory/baremetal.py`, `inventory/lxc.py`) it is the switch, undoing the old one.

Proxmox nodes (`pve_nodes`); the guest of a profile not in use is stopped with `onboot: 0` first (the
`lxc` container when the host has `lxc` data, the VM when it has `vm` data):
- `vm`: the host driver parked (what loads or serves it at boot disabled), host prepared (vfio binding
  with the nvidia blacklist, reboot if allowed), PCI mappings from the live IOMMU groups, the Q35 VM
  converged (`onboot: 1`) and started once the binding is in effect.
- `lxc` / `baremetal`: the managed VM stopped and `onboot: 0` first (it lets go of the GPUs; on `lxc` a
  host SGLang service left by `baremetal` too), then the host
  prepared for its own driver (vfio binding and nvidia blacklist removed, reboot if allowed), the driver
  with its kernel module built for the Proxmox kernel and the device nodes made at boot; `lxc`: then the
  container with the GPU device entries, started, its driver checked against the host's module.
Serving hosts: the NVIDIA driver and the SGLang service: `vm_guests` (the VM's guest), `lxc_guests` (the
container: userspace driver only, at the host module's version), `baremetal_hosts` (the node itself,
whose driver the node's steps installed; a bare-metal host that is not Proxmox gets it here).
While the GPUs stay on vfio-pci (a reboot pending and `pve_host.allow_reboot` false) the host driver and
what needs it wait, and the run says so. A guest that does not exist yet (first run) cannot be reached:
run site.py again once it is up.
"""

from pyinfra.context import host

from roles.host_driver import host_driver_parked_role
from roles.lxc_gpu import lxc_gpu, lxc_gpu_parked
from roles.nvidia_driver import nvidia_driver
from roles.pci_mapping import node_of, pci_mapping
from roles.pve_host import host_driver_blocked, pve_host
from roles.q35_vm import q35_vm_parked, q35_vm_role
from roles.sglang import sglang

pve_node = "pve_nodes" in host.groups
blocked = False
if pve_node:
    profile = node_of(host).profile
    # The old profile's guest lets go of the GPUs before the host rebinds them.
    if profile != "lxc":
        lxc_gpu_parked()
    if profile != "vm":
        q35_vm_parked()
    if profile != "baremetal":
        host_driver_parked_role()
    pve_host()
    if profile == "vm":
        pci_mapping()
        q35_vm_role()
    else:
        # Without a reboot the GPUs stay on vfio-pci: the host driver and what needs it wait (said).
        blocked = host_driver_blocked() is not None
        if not blocked:
            nvidia_driver(placement="pve-host")
            if profile == "lxc":
                lxc_gpu()
if "vm_guests" in host.groups:
    nvidia_driver()
    sglang()
if "lxc_guests" in host.groups:
    nvidia_driver(placement="container")
    sglang()
if "baremetal_hosts" in host.groups and not blocked:
    if not pve_node:
        nvidia_driver()
    sglang()
