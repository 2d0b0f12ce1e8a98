"""The inventory groups pvegpu's deploys act on. An inventory puts each host in the group of what it is;
each deploy entry point names the groups it acts on and leaves every other host alone
(pvegpu/run/dispatch.py).
"""

from __future__ import annotations

PVE_NODES = "pve_nodes"  # Proxmox nodes: host preparation, mappings, the VM or the container
VM_GUESTS = "vm_guests"  # the VMs' guests: driver with its module, SGLang
LXC_GUESTS = "lxc_guests"  # the `lxc` profile's containers: userspace driver, SGLang
BAREMETAL_HOSTS = "baremetal_hosts"  # hosts serving on their own driver (a Proxmox node or plain Debian)

SERVING = (VM_GUESTS, LXC_GUESTS, BAREMETAL_HOSTS)
