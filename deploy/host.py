"""`pyinfra INVENTORY deploy/host.py`: prepare each Proxmox node for its profile (see roles/pve_host.py)."""

from roles.pve_host import pve_host

pve_host()
