"""`pyinfra INVENTORY deploy/vm.py`: on each Proxmox node (group `pve_nodes`), the PCI mappings from the
live IOMMU groups, the model's store (`model`: the VM's virtiofs reads it), then the Q35 VM, started. Every
other host is left alone."""

from pvegpu.models.groups import PVE_NODES
from pvegpu.run.dispatch import dispatch
from pvegpu.run.read_ahead import read_vm_resources_ahead
from roles.model_store import model_store
from roles.pci_mapping import pci_mapping
from roles.q35_vm import q35_vm_role

dispatch("deploy/vm.py", [((PVE_NODES,), [read_vm_resources_ahead, pci_mapping, model_store, q35_vm_role])])
