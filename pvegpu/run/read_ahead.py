"""The `vm` step's Proxmox API reads, answered or sent at once while pyinfra prepares the node.

The VM's config, the storages its files use and the PCI mappings with this node's checks (when this node
syncs them) are answered from the files the node's one read brought (pvegpu/run/node_state.py,
pvegpu/facts/pve_files.py; pvegpu.pve.host_client `seed`), and the VM's status from its QEMU process in
that read (`seed_status`: while nothing ran on the node and pvegpu wrote nothing through the API), else sent
(`read_ahead`). Each operation then takes its answer from its first read, so the reads cost at most one
round trip together, not one each. deploy/vm.py, deploy/rebuild_vm.py and roles/site.py run
`read_vm_resources_ahead` first on a node with the `vm` step.
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra.context import host

from pvegpu.facts.node_read import STORAGE_CFG
from pvegpu.facts.pve_files import mappings_answer, qemu_config_answer, qemu_status_answer, storage_answer
from pvegpu.models.specs import host_specs
from pvegpu.plan.vm import storages_used
from pvegpu.pve.client import PveClient
from pvegpu.pve.host_client import pve_client, read_ahead, seed, seed_status
from pvegpu.run.node_state import MAPPING_CFG, node_state_of, unchanged_node_state, vm_config_path
from pvegpu.run.plan import syncs_mappings

Read = Callable[[PveClient], object]


def read_vm_resources_ahead() -> None:
    """Answer or send the reads above for this node's VM (nothing without `vm` data)."""
    specs = host_specs(host.data)
    spec = specs.vm
    if spec is None:
        return
    node, vmid = specs.node.name, spec.vmid
    api = pve_client(host)
    state = node_state_of(host)
    files = state.pve_files
    config, storage_cfg = files.get(vm_config_path(node, vmid)), files.get(STORAGE_CFG)
    mapping_cfg = files.get(MAPPING_CFG)
    vm_answer = None if config is None else qemu_config_answer(config)  # None too when it holds [PENDING]
    answered: list[tuple[Read, object | None]] = [
        (lambda api: api.vm_config(node, vmid), vm_answer),
        # Without [PENDING] the values in effect are the same (vm_pending's read); no file: no VM to read.
        *([] if config is None else [(lambda api: api.vm_config(node, vmid, current=True), vm_answer)]),
        *(
            (_storage(name), None if storage_cfg is None else storage_answer(storage_cfg, name))
            for name in storages_used(spec)
        ),
    ]
    if syncs_mappings(host):
        mappings = None if mapping_cfg is None else mappings_answer(mapping_cfg, node, state.hardware)
        answered.append((lambda api: api.mappings(check_node=node), mappings))
    reads: list[Read] = [read for read, answer in answered if answer is None or not seed(api, read, answer)]
    process = state.qemu_processes.get(vmid)
    status = None if config is None or process is None else qemu_status_answer(config, process, vmid)

    def read_status(api: PveClient) -> object:
        return api.vm_status(node, vmid)

    target = host.state.inventory.get_host(host.name)

    def fresh() -> bool:  # the node's read still holds: nothing on the node ran a command since
        return unchanged_node_state(target) is not None

    if status is None or not seed_status(api, read_status, status, fresh):
        reads.append(read_status)
    read_ahead(api, reads)


def _storage(name: str) -> Read:
    return lambda api: api.storage(name)
