"""`pyinfra INVENTORY deploy/rebuild_vm.py`: after a BIOS change. On each Proxmox node (`pve_nodes`): re-read
the topology, compare the mappings with it (Proxmox's check-node and pvegpu's diff), repair them (printing
per GPU old -> new address and group), reconcile hostpci, start the VM. On each VM guest (`vm_guests`):
verify it sees its GPUs. Every other host is left alone. A second run changes nothing."""

from pvegpu.models.groups import PVE_NODES, VM_GUESTS
from pvegpu.run.dispatch import dispatch
from pvegpu.run.read_ahead import read_vm_resources_ahead
from roles.guest_check import guest_check
from roles.pci_mapping import pci_mapping
from roles.q35_vm import q35_vm_role

dispatch(
    "deploy/rebuild_vm.py",
    [((PVE_NODES,), [read_vm_resources_ahead, pci_mapping, q35_vm_role]), ((VM_GUESTS,), [guest_check])],
)
