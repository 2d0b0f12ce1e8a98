"""`pyinfra INVENTORY deploy/site.py`: every step of the inventory's profile, in order; run with another
profile's inventory (`inventory/baremetal.py`, `inventory/lxc.py`) it is the switch, undoing the old one.

Proxmox nodes (`pve_nodes`), roles/site.py `node_site`: the old profile's guest stopped with `onboot: 0`
and the host driver's boot units parked, the host prepared (reboot if allowed), then `vm`: PCI mappings and
the Q35 VM, started; `lxc` / `baremetal`: the host driver and, on `lxc`, the container with the GPU device
entries. Serving hosts (`vm_guests`, `lxc_guests`, `baremetal_hosts`), roles/site.py `serving`: the NVIDIA
driver and the SGLang service. Every host then gets Prometheus' node exporter and pvegpu's gauges
(roles/node_exporter.py). While the GPUs stay on vfio-pci (a reboot pending and
`pve_host.allow_reboot` false) the host driver and what needs it wait, and the run says so. A guest that
does not exist yet (first run) cannot be reached: run site.py again once it is up. Every other host is left
alone.
"""

from pvegpu.models.groups import PVE_NODES, SERVING
from pvegpu.run.dispatch import dispatch
from roles.site import node_site, serving

dispatch("deploy/site.py", [((PVE_NODES,), [node_site]), (SERVING, [serving])])
