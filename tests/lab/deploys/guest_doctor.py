"""Test deploy: the read-only NCCL transport report of the SGLang role (what deploy/doctor.py runs on
serving hosts)."""

from roles.nccl_doctor import nccl_transports

nccl_transports()
