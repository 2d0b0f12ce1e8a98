"""pci_mapping: the cluster's PCI mappings (`gpu0`...) derived from the live IOMMU groups of every node.

The nodes of one cluster (hosts whose `pve.cluster` is the same; a host without one is its own cluster)
share one set of mappings with one `map` line per node, so the first of them (by inventory name) syncs
them for all, from every node's plan. Map lines of nodes outside that cluster are someone else's: kept.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.context import host, inventory

from pvegpu.facts.pve import api_spec, pve_client
from pvegpu.host_plan import plan_of
from pvegpu.models.groups import PVE_NODES
from pvegpu.operations.mapping import pci_mappings
from pvegpu.plan.mapping import MappingPlanError, plan_mappings


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


@deploy("Sync the PCI mappings")
def pci_mapping() -> None:
    """One mapping per GPU with one map line per cluster node, synced through the API (see the module)."""
    peers = cluster_hosts(host)
    if not syncs_mappings(host):
        logger.info(f"{host.print_prefix}PCI mappings of this cluster are synced by {peers[0].name}")
        return
    plan = plan_of(host)
    topologies = {plan_of(peer).specs.node.name: plan_of(peer).topology for peer in peers}
    try:
        desired = plan_mappings(topologies, plan.mapping_prefix)
    except MappingPlanError as error:
        raise OperationError(f"{host.name}: cannot map the GPUs:\n{error}") from None
    pci_mappings(
        name="Sync the PCI mappings with the live IOMMU groups",
        api=pve_client(host),
        desired=desired,
        node=plan.specs.node.name,
        prefix=plan.mapping_prefix,
        cluster=sorted(topologies),
    )
