"""A host's NVIDIA driver plan for this run (pvegpu/plan/driver.py `DriverPlan`), from its plan and its one
state read: what the driver role reads instead of planning for itself."""

from __future__ import annotations

from pyinfra.api.host import Host

from pvegpu.plan.driver import DriverPlan, Placement, plan_driver
from pvegpu.run.host_state import state_of
from pvegpu.run.plan import plan_of


def driver_plan_of(target: Host, placement: Placement) -> DriverPlan:
    """`target`'s driver plan at `placement`; PlanError when its data does not fit (the role's
    `plan_failures` reports it). A Proxmox node's boot unit makes a device node per GPU of its topology
    (`node.gpus.count` may be unset), read only there."""
    plan, observed = plan_of(target), state_of(target)
    gpus = len(plan.topology.gpus) if placement == "pve-host" else 0
    return plan_driver(plan.specs, placement, observed.os_release, observed.kernel, gpus)
