"""self_heal: the node repairs renumber-only drift of the VM's GPU mappings itself, at every VM start.

With `vm.self_heal` `repair` or `check`: pvegpu's pre-start hookscript is on the node
(pvegpu/operations/hook.py, its storage offering `snippets`: roles/snippets.py) before the VM role sets the
VM's `hookscript` to it (check_hookscript refuses a volume that does not exist). With `off` nothing is
installed and the VM role removes pvegpu's `hookscript` from the VM (plan/vm.py).
"""

from __future__ import annotations

from pvegpu.hook.bundle import build, wrapper
from pvegpu.models.inventory import NodeSpec
from pvegpu.models.vm import VmSpec
from pvegpu.operations.hook import hook_installed
from pvegpu.plan.vm import HOOKSCRIPT
from pvegpu.pve import PveClient
from roles.snippets import snippets_directory


def self_heal(api: PveClient, node: NodeSpec, spec: VmSpec) -> None:
    """The steps above for the VM `spec` on `node` (nothing for `self_heal: off`)."""
    if spec.self_heal == "off":
        return
    bundle = build()
    hook_installed(
        name="The node's pre-start hookscript is installed",
        bundle=bundle,
        wrapper_path=f"{snippets_directory(api, spec.snippets_storage)}/{HOOKSCRIPT}",
        wrapper=wrapper(
            bundle, mode=spec.self_heal, prefix=spec.mapping_prefix, sysfs_root=str(node.sysfs_root)
        ),
    )
