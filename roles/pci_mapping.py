"""pci_mapping: the cluster's PCI mappings (`gpu0`...) derived from the live IOMMU groups of every node.

The nodes of one cluster (hosts whose `pve.cluster` is the same; a host without one is its own cluster)
share one set of mappings with one `map` line per node, so the first of them (by inventory name) syncs
them for all, from every node's hardware fact.
"""

from __future__ import annotations

from typing import Any

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host, inventory

from pvegpu.facts.hardware import hardware_of
from pvegpu.facts.pve import api_spec, pve_client
from pvegpu.models.inventory import NODE_KEY, NodeSpec, spec_of
from pvegpu.models.vm import VM_KEY, VmSpec
from pvegpu.operations.mapping import pci_mappings
from pvegpu.plan.mapping import DEFAULT_PREFIX, MappingPlanError, plan_mappings
from pvegpu.plan.topology import Topology, plan_topology


def node_of(target: Any) -> NodeSpec:
    """The `node` spec of a pyinfra host."""
    return spec_of(target.data, NODE_KEY, NodeSpec)


def mapping_prefix(target: Any) -> str:
    """The host's `vm.mapping_prefix`, or the default when it has no `vm` data."""
    value = target.data.get(VM_KEY)
    return DEFAULT_PREFIX if value is None else spec_of({VM_KEY: value}, VM_KEY, VmSpec).mapping_prefix


def cluster_hosts(target: Any) -> list[Any]:
    """The inventory hosts in `target`'s cluster, sorted by name (`target` alone when it has none)."""
    cluster = api_spec(target.data).cluster
    if cluster is None:
        return [target]
    peers = [other for other in inventory if api_spec(other.data).cluster == cluster]
    return sorted(peers, key=lambda other: other.name)


def topology_of(target: Any) -> Topology:
    """The planned GPU topology of a host from its hardware fact."""
    node = node_of(target)
    return plan_topology(hardware_of(target, node.sysfs_root), node.gpus)


@deploy("Sync the PCI mappings")
def pci_mapping() -> None:
    """One mapping per GPU with one map line per cluster node, synced through the API (see the module)."""
    peers = cluster_hosts(host)
    if peers[0] is not host:
        logger.info(f"{host.print_prefix}PCI mappings of this cluster are synced by {peers[0].name}")
        return
    prefix = mapping_prefix(host)
    try:
        desired = plan_mappings({node_of(peer).name: topology_of(peer) for peer in peers}, prefix)
    except MappingPlanError as error:
        raise OperationError(f"{host.name}: cannot map the GPUs:\n{error}") from None
    pci_mappings(
        name="Sync the PCI mappings with the live IOMMU groups",
        api=pve_client(host),
        desired=desired,
        node=node_of(host).name,
        prefix=prefix,
    )
