"""`pyinfra INVENTORY deploy/vm.py`: PCI mappings from live IOMMU groups, then the Q35 VM, started
(Proxmox nodes: group `pve_nodes`)."""

from pyinfra.context import host

from roles.pci_mapping import pci_mapping
from roles.q35_vm import q35_vm_role

if "pve_nodes" in host.groups:
    pci_mapping()
    q35_vm_role()
