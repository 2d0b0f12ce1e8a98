"""Test deploy: what a profile switch does first on a Proxmox node, alone: park the node's VM and its
container (roles/guest_parked.py), each only when it carries pvegpu's mark."""

from pvegpu.models.groups import PVE_NODES
from pvegpu.operations.pve_guest import CT, VM
from pvegpu.run.dispatch import dispatch
from roles.guest_parked import guest_parked_role

dispatch(
    "tests/lab/deploys/park_guests.py",
    [((PVE_NODES,), [lambda: guest_parked_role(VM), lambda: guest_parked_role(CT)])],
)
