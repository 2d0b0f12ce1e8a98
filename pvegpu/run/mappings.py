"""The cluster's PCI mappings as pvegpu wants them, planned by the node that syncs them (pvegpu/run/plan.py
`syncs_mappings`) from the plan of every node in its cluster: each node's GPU topology, and the GPUs its VM
passes single-function (pvegpu/plan/p2p.py `single_function_gpus`: with `vm.p2p: on` those of the planned
clique, with `probe` those the VM's config holds a clique part for, read through the API)."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api.host import Host

from pvegpu.models.pve import PciMapping
from pvegpu.plan.mapping import plan_mappings
from pvegpu.plan.p2p import single_function_gpus
from pvegpu.pve.errors import PveError
from pvegpu.pve.host_client import pve_client
from pvegpu.run.plan import cluster_hosts, plan_of


@dataclass(frozen=True)
class ClusterMappings:
    """The mappings (`plan_mappings`) over the cluster's nodes (`nodes`, sorted)."""

    nodes: tuple[str, ...]
    desired: tuple[PciMapping, ...]


def cluster_mappings(target: Host) -> ClusterMappings:
    """The mappings of `target`'s cluster (module docstring). PlanError naming every problem (the role's
    `plan_failures` reports it)."""
    peers = cluster_hosts(target)
    topologies = {plan_of(peer).specs.node.name: plan_of(peer).topology for peer in peers}
    single = {plan_of(peer).specs.node.name: _single_function(peer) for peer in peers}
    desired = plan_mappings(topologies, plan_of(target).mapping_prefix, single)
    return ClusterMappings(tuple(sorted(topologies)), desired)


def _single_function(peer: Host) -> frozenset[int]:
    """The GPU indexes `peer`'s VM passes single-function (none without a VM or `vm.p2p`)."""
    vm = plan_of(peer).vm
    if vm is None or vm.spec.p2p == "off":
        return frozenset()
    args = None
    if vm.spec.p2p == "probe":
        try:
            args = pve_client(peer).vm_config(plan_of(peer).specs.node.name, vm.spec.vmid).values.get("args")
        except PveError:  # no such VM yet (or unreadable: the VM role says so): whole slots
            args = None
    return single_function_gpus(vm.spec.p2p, vm.clique, None if args is None else str(args))
