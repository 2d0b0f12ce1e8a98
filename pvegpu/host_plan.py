"""`plan_of(host)`: the host's NodePlan (pvegpu/plan/node.py), computed once per host and run.

The plan's inputs are read here, once: the validated specs (`host.data`), the host's inventory groups, the
PCI hardware fact and, on a Proxmox node, the CPU vendor and kernel release (one command). pyinfra calls the
roles while it prepares a run; every role of the run then reads the same plan.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pyinfra.api.host import Host
from pyinfra.api.state import State

from pvegpu.facts.cpu import cpu_kernel_of
from pvegpu.facts.hardware import hardware_of
from pvegpu.models.groups import PVE_NODES
from pvegpu.models.specs import host_specs
from pvegpu.plan.node import NodeObserved, NodePlan, plan_node

_PLANS: WeakKeyDictionary[State, dict[str, NodePlan]] = WeakKeyDictionary()


def plan_of(target: Host) -> NodePlan:
    """The plan of pyinfra host `target` for this run (read and computed on first use)."""
    plans = _PLANS.setdefault(target.state, {})
    plan = plans.get(target.name)
    if plan is None:
        specs = host_specs(target.data)
        groups = frozenset(target.groups)
        observed = NodeObserved(
            hardware=hardware_of(target, specs.node.sysfs_root),
            cpu_kernel=cpu_kernel_of(target) if PVE_NODES in groups else None,
        )
        plan = plans[target.name] = plan_node(target.name, specs, groups, observed)
    return plan
