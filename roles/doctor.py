"""Doctor: a read-only report of each node. It reads facts and prints; it never changes a host."""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.facts.hardware import PciHardware
from pvegpu.models.inventory import NODE_KEY, NodeSpec
from pvegpu.plan.topology import plan_topology
from pvegpu.report import render_table


@deploy("Report the GPU topology")
def gpu_topology() -> None:
    """Print the node's GPUs (cards, IOMMU groups, root buses, NUMA nodes, links, verdicts).

    All hardware facts come from one remote command (`PciHardware`).
    """
    spec = NodeSpec.model_validate(host.data.get(NODE_KEY))
    hardware = host.get_fact(PciHardware, sysfs_root=spec.sysfs_root)
    topology = plan_topology(hardware, spec.gpus)
    report = render_table(topology)
    log = logger.info if topology.ok else logger.warning
    log(f"{host.print_prefix}GPU topology of node {spec.name} (profile {spec.profile}):\n{report}")
