"""pci_mapping: the cluster's PCI mappings (`gpu0`...) derived from the live IOMMU groups of every node.

The nodes of one cluster (hosts whose `pve.cluster` is the same; a host without one is its own cluster)
share one set of mappings with one `map` line per node, so the first of them (by inventory name) syncs
them for all, from every node's plan. Map lines of nodes outside that cluster are someone else's: kept.
A node's GPUs that its VM gives a GPUDirect clique (`vm.p2p`) are mapped single-function
(plan/p2p.py `single_function_gpus`; with `probe`, as the VM's config holds the clique).
Each mapping carries pvegpu's mark (`pvegpu-owner: <id>` in its description, the syncing node's id:
pvegpu/plan/ownership.py); a `gpuN` without it is refused while preparing, unless `mapping.adopt`.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.host import Host
from pyinfra.context import host, inventory

from pvegpu.models.groups import PVE_NODES
from pvegpu.operations.mapping import foreign_mappings, pci_mappings
from pvegpu.plan.mapping import plan_mappings
from pvegpu.plan.ownership import owner_id
from pvegpu.plan.p2p import clique_args, plan_cliques, single_function_gpus
from pvegpu.pve.errors import PveError
from pvegpu.pve.host_client import api_spec, pve_client
from pvegpu.run.plan import plan_failures, plan_of


def cluster_hosts(target: Host) -> list[Host]:
    """The inventory hosts in `target`'s cluster, sorted by name (`target` alone when it has none)."""
    # From the data alone: a plan reads its host's hardware, which this does not need.
    cluster = api_spec(target.data).cluster
    if cluster is None:
        return [target]
    peers = [
        other for other in inventory if PVE_NODES in other.groups and api_spec(other.data).cluster == cluster
    ]
    return sorted(peers, key=lambda other: other.name)


def syncs_mappings(target: Host) -> bool:
    """Whether `target` is the node that syncs its cluster's mappings: the first by inventory name."""
    return cluster_hosts(target)[0] is target


def _single_function(peer: Host) -> frozenset[int]:
    """The GPU indexes `peer`'s VM passes single-function (none without a VM or `vm.p2p`)."""
    plan = plan_of(peer)
    spec = plan.specs.vm
    if spec is None or spec.p2p == "off":
        return frozenset()
    planned = clique_args(plan_cliques(plan.topology, plan.cpu_vendor))
    args = None
    if spec.p2p == "probe":
        try:
            args = pve_client(peer).vm_config(plan.specs.node.name, spec.vmid).values.get("args")
        except PveError:  # no such VM yet (or unreadable: the VM role says so): whole slots
            args = None
    return single_function_gpus(spec.p2p, planned, None if args is None else str(args))


@deploy("Sync the PCI mappings")
def pci_mapping() -> None:
    """One mapping per GPU with one map line per cluster node, synced through the API (see the module)."""
    peers = cluster_hosts(host)
    if not syncs_mappings(host):
        logger.info(f"{host.print_prefix}PCI mappings of this cluster are synced by {peers[0].name}")
        return
    plan = plan_of(host)
    topologies = {plan_of(peer).specs.node.name: plan_of(peer).topology for peer in peers}
    single = {plan_of(peer).specs.node.name: _single_function(peer) for peer in peers}
    with plan_failures(host, "cannot map the GPUs:\n"):
        desired = plan_mappings(topologies, plan.mapping_prefix, single)
    pve, node = plan.specs.pve, plan.specs.node.name
    owner, adopt = owner_id(pve.owner, pve.cluster, node), plan.specs.mapping.adopt
    api = pve_client(host)
    # Before anything of the run is written: a gpuN without pvegpu's mark is refused (unless mapping.adopt).
    foreign_mappings(api, desired, node, plan.mapping_prefix, owner=owner, adopt=adopt)
    pci_mappings(
        name="Sync the PCI mappings with the live IOMMU groups",
        api=api,
        desired=desired,
        node=node,
        prefix=plan.mapping_prefix,
        cluster=sorted(topologies),
        owner=owner,
        adopt=adopt,
    )
