"""What the node doctor (roles/doctor.py) reads through the Proxmox API and of the node's hook files, each
when the report asks for it; its findings are pvegpu/plan/doctor.py's. A read that fails (an API error, `pve`
data that gives no client) is `NotRead` with its one line: the report says so and goes on.

- `granted_privileges`: `GET /access/permissions?path=<path>` per ACL path (the token's privileges there).
- `vm_mappings`: `GET /cluster/mapping/pci` (the cluster's PCI mapping sections).
- `hook_read`: the VM's `hookscript`, the snippets storage's directory, and with `vm.self_heal` on the sha256
  of the wrapper and the zipapp on the node beside that of the bytes this pvegpu writes (`hook_files`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from pyinfra.api.host import Host

from pvegpu.hook.bundle import BUNDLE_PATH, Bundle, build, wrapper
from pvegpu.models.doctor import HookRead, NodeFile, NotRead
from pvegpu.models.pve import PciMapping
from pvegpu.models.vm import VmSpec
from pvegpu.plan.node import NodePlan
from pvegpu.plan.vm import HOOKSCRIPT
from pvegpu.pve.errors import PveError
from pvegpu.pve.host_client import PveSetupError, pve_client
from pvegpu.run.reports import file_sha256


def granted_privileges(target: Host, paths: Sequence[str]) -> Mapping[str, frozenset[str]] | NotRead:
    """The privileges `target`'s API identity holds on each of `paths`."""
    try:
        api = pve_client(target)
        return {path: api.permissions(path) for path in paths}
    except (PveError, PveSetupError) as error:
        return not_read(error)


def vm_mappings(target: Host) -> tuple[PciMapping, ...] | NotRead:
    """The cluster's PCI mapping sections, as `target`'s API lists them."""
    try:
        return tuple(state.mapping for state in pve_client(target).mappings())
    except (PveError, PveSetupError) as error:
        return not_read(error)


def hook_read(target: Host, plan: NodePlan) -> HookRead | NotRead:
    """What `target`'s VM's hook is judged on (pvegpu/plan/doctor.py `HookRead`); the node's files only
    with `vm.self_heal` on."""
    vm, node = plan.specs.vm, plan.specs.node
    assert vm is not None  # the doctor asks only with `vm` data
    try:
        api = pve_client(target)
        current = api.vm_config(node.name, vm.vmid).values.get("hookscript")
        directory = api.storage(vm.snippets_storage).path
    except (PveError, PveSetupError) as error:
        return not_read(error)
    if vm.self_heal == "off":
        return HookRead(current)
    bundle = build()
    wanted = hook_files(plan, vm, directory, bundle)
    files = tuple(NodeFile(path, file_sha256(target, path), sha256) for path, sha256 in wanted)
    return HookRead(current, files, bundle.version)


def hook_files(
    plan: NodePlan, vm: VmSpec, directory: str | None, bundle: Bundle
) -> tuple[tuple[str, str], ...]:
    """The hook of VM `vm` on `plan`'s node as this pvegpu writes it, (path, sha256): the wrapper in the
    snippets storage's `directory` and the zipapp `bundle` (pvegpu/operations/hook.py installs the same)."""
    node = plan.specs.node
    text = wrapper(
        bundle, mode=vm.self_heal, prefix=vm.mapping_prefix, owner=plan.owner, sysfs_root=str(node.sysfs_root)
    )
    files = ((f"{directory}/snippets/{HOOKSCRIPT}", text.encode()), (BUNDLE_PATH, bundle.data))
    return tuple((path, hashlib.sha256(data).hexdigest()) for path, data in files)


def not_read(error: PveError | PveSetupError) -> NotRead:
    """`error` as the report's one line."""
    return NotRead(error.line if isinstance(error, PveError) else str(error))
