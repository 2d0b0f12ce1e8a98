"""`pyinfra INVENTORY deploy/doctor.py`: read-only report of every node (no change is ever made)."""

from roles.doctor import gpu_topology

gpu_topology()
