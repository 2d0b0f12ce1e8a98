"""`pyinfra INVENTORY deploy/rebuild_vm.py`: after a BIOS change. On each Proxmox node (`pve_nodes`): re-read
the topology, compare the mappings with it (Proxmox's check-node and pvegpu's diff), repair them (printing
per GPU old -> new address and group), reconcile hostpci, start the VM. On each VM guest (`vm_guests`)
in the inventory: verify it sees its GPUs. A second run changes nothing."""

from pyinfra.context import host

from roles.pci_mapping import pci_mapping
from roles.q35_vm import guest_check, q35_vm_role

if "pve_nodes" in host.groups:
    pci_mapping()
    q35_vm_role()
if "vm_guests" in host.groups:
    guest_check()
