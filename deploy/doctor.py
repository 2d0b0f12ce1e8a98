"""`pyinfra INVENTORY deploy/doctor.py`: read-only report of every host (no change is ever made).

Proxmox nodes and bare-metal hosts: GPU topology and host checks. Serving guests (group `vm_guests`): the NCCL
transports the running SGLang service uses, checked against the profile's P2P expectation.
"""

from pyinfra.context import host

from roles.doctor import node_report
from roles.sglang import nccl_transports

if "vm_guests" in host.groups:
    nccl_transports()
else:
    node_report()
