"""The `vm` step's Proxmox API reads, sent at once while pyinfra prepares the node (pvegpu.facts.pve
`read_ahead`): the PCI mappings with this node's checks (when this node syncs them), the VM's config and
status, and the storages its files use. Each operation then takes its answer from its first read, so the
reads cost one round trip together, not one each."""

from __future__ import annotations

from collections.abc import Callable

from pyinfra.context import host

from pvegpu.facts.pve import pve_client, read_ahead
from pvegpu.host_plan import plan_of
from pvegpu.pve import PveClient
from roles.pci_mapping import syncs_mappings
from roles.snippets import storages_used


def read_vm_resources_ahead() -> None:
    """Send the reads above for this node's VM (nothing without `vm` data)."""
    plan = plan_of(host)
    spec = plan.specs.vm
    if spec is None:
        return
    node, vmid = plan.specs.node.name, spec.vmid
    reads: list[Callable[[PveClient], object]] = [
        lambda api: api.vm_config(node, vmid),
        lambda api: api.vm_status(node, vmid),
        *(_storage(name) for name in storages_used(spec)),
    ]
    if syncs_mappings(host):
        reads.append(lambda api: api.mappings(check_node=node))
    read_ahead(pve_client(host), reads)


def _storage(name: str) -> Callable[[PveClient], object]:
    return lambda api: api.storage(name)
