"""pci_mapping: the cluster's PCI mappings (`gpu0`...) derived from the live IOMMU groups of every node.

The nodes of one cluster (hosts whose `pve.cluster` is the same; a host without one is its own cluster)
share one set of mappings with one `map` line per node, so the first of them (by inventory name) syncs
them for all, from every node's plan. Map lines of nodes outside that cluster are someone else's: kept.
A node's GPUs that its VM gives a GPUDirect clique (`vm.p2p`) are mapped single-function
(plan/p2p.py `single_function_gpus`; with `probe`, as the VM's config holds the clique).
Each mapping carries pvegpu's mark (`pvegpu-owner: <id>` in its description, the syncing node's id:
pvegpu/plan/ownership.py); a `gpuN` without it is refused while preparing, unless `mapping.adopt`.
The cluster's nodes and mappings: pvegpu/run/plan.py `cluster_hosts`, pvegpu/run/mappings.py.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.operations.mapping import foreign_mappings, pci_mappings
from pvegpu.pve.host_client import pve_client
from pvegpu.run.mappings import cluster_mappings
from pvegpu.run.plan import cluster_hosts, plan_failures, plan_of, syncs_mappings


@deploy("Sync the PCI mappings")
def pci_mapping() -> None:
    """One mapping per GPU with one map line per cluster node, synced through the API (see the module)."""
    if not syncs_mappings(host):
        logger.info(
            f"{host.print_prefix}PCI mappings of this cluster are synced by {cluster_hosts(host)[0].name}"
        )
        return
    plan = plan_of(host)
    with plan_failures(host, "cannot map the GPUs:\n"):
        cluster = cluster_mappings(host)
    node, owner, adopt = plan.specs.node.name, plan.owner, plan.specs.mapping.adopt
    api = pve_client(host)
    # Before anything of the run is written: a gpuN without pvegpu's mark is refused (unless mapping.adopt).
    foreign_mappings(api, cluster.desired, node, plan.mapping_prefix, owner=owner, adopt=adopt)
    pci_mappings(
        name="Sync the PCI mappings with the live IOMMU groups",
        api=api,
        desired=cluster.desired,
        node=node,
        prefix=plan.mapping_prefix,
        cluster=cluster.nodes,
        owner=owner,
        adopt=adopt,
    )
