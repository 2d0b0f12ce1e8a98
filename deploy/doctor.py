"""`pyinfra INVENTORY deploy/doctor.py`: read-only report (no change is ever made).

Proxmox nodes and bare-metal hosts (`pve_nodes`, `baremetal_hosts`): GPU topology and host checks; a node's
model store (`model`), whether it is the verified revision (roles/model_doctor.py). Serving
hosts (`vm_guests`, `lxc_guests`, `baremetal_hosts`): the NCCL transports the running SGLang service uses,
checked against the profile's P2P expectation; on a VM guest first NCCL's lines with and without its
topology file (roles/nccl_doctor.py); with `sglang.model_repo`, whether the model is the verified revision
(roles/model_doctor.py); on a VM guest whose driver is installed, whether its next kernel has the module
(roles/guest_doctor.py). Every other host is left alone.
"""

from pvegpu.models.groups import BAREMETAL_HOSTS, PVE_NODES, SERVING
from pvegpu.run.dispatch import dispatch
from roles.doctor import node_report
from roles.guest_doctor import guest_next_boot
from roles.model_doctor import model_report, node_model_report
from roles.nccl_doctor import nccl_transports

dispatch(
    "deploy/doctor.py",
    [
        ((PVE_NODES, BAREMETAL_HOSTS), [node_report]),
        ((PVE_NODES,), [node_model_report]),
        (SERVING, [nccl_transports, model_report, guest_next_boot]),
    ],
)
