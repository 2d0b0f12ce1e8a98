"""`pyinfra INVENTORY deploy/guest.py`: the NVIDIA driver, the SGLang service and the node exporter with
pvegpu's gauges on each guest: group `vm_guests` (the VMs' guests: the driver with its module) and
`lxc_guests` (containers: userspace only, at the host module's version); roles/site.py `serving`. Every other
host is left alone (a bare-metal host's driver and service come with deploy/site.py)."""

from pvegpu.models.groups import LXC_GUESTS, VM_GUESTS
from pvegpu.run.dispatch import dispatch
from roles.site import serving

dispatch("deploy/guest.py", [((VM_GUESTS, LXC_GUESTS), [serving])])
