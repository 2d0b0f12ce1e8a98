"""`pyinfra INVENTORY deploy/doctor.py`: read-only report of every host (no change is ever made).

Proxmox nodes and bare-metal hosts: GPU topology and host checks. Serving hosts (groups `vm_guests`,
`lxc_guests`, `baremetal_hosts`): the NCCL transports the running SGLang service uses, checked against the
profile's P2P expectation.
"""

from pyinfra.context import host

from roles.doctor import node_report
from roles.sglang import nccl_transports

groups = set(host.groups)
if not groups & {"vm_guests", "lxc_guests"}:
    node_report()
if groups & {"vm_guests", "lxc_guests", "baremetal_hosts"}:
    nccl_transports()
