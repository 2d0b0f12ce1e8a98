"""`pyinfra INVENTORY deploy/host.py`: prepare each Proxmox node (group `pve_nodes`) for its profile:
kernel command line, vfio binding, reboot when needed and allowed, verify (roles/pve_host.py). Every other
host is left alone."""

from pvegpu.models.groups import PVE_NODES
from pvegpu.run.dispatch import dispatch
from roles.pve_host import pve_host

dispatch("deploy/host.py", [((PVE_NODES,), [pve_host])])
