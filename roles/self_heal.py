"""self_heal: the node repairs renumber-only drift of the VM's GPU mappings itself, at every VM start.

With `vm.self_heal` `repair` or `check`: pvegpu's pre-start hookscript is on the node
(pvegpu/operations/hook.py, its storage offering `snippets`: roles/snippets.py) before the VM role sets the
VM's `hookscript` to it (check_hookscript refuses a volume that does not exist). With `off` nothing is
installed and the VM role removes pvegpu's `hookscript` from the VM (plan/vm.py). A shared snippets
storage is refused before any host is changed (the role runs while pyinfra collects operations): root runs
the hookscript, and other nodes could write it there (pvegpu/operations/hook.py).
"""

from __future__ import annotations

from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.hook.bundle import build, wrapper
from pvegpu.models.node import NodeSpec
from pvegpu.models.vm import VmSpec
from pvegpu.operations.hook import hook_installed, shared_storage_refusal
from pvegpu.plan.vm import HOOKSCRIPT
from pvegpu.pve.client import PveClient
from roles.snippets import directory_of, snippets_storage


def self_heal(api: PveClient, node: NodeSpec, spec: VmSpec) -> None:
    """The steps above for the VM `spec` on `node` (nothing for `self_heal: off`)."""
    if spec.self_heal == "off":
        return
    storage = snippets_storage(api, spec.snippets_storage)
    refusal = shared_storage_refusal(storage)
    if refusal is not None:
        raise OperationError(f"{host.name}: {refusal}")
    bundle = build()
    hook_installed(
        name="The node's pre-start hookscript is installed",
        bundle=bundle,
        wrapper_path=f"{directory_of(storage)}/{HOOKSCRIPT}",
        wrapper=wrapper(
            bundle, mode=spec.self_heal, prefix=spec.mapping_prefix, sysfs_root=str(node.sysfs_root)
        ),
    )
