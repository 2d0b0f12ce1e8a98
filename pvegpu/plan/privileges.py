"""Which of the API token's privileges are missing, from its effective privileges per ACL path. Pure.

The doctor reads the token's privileges with `GET /access/permissions?path=<path>` (pve-access-control
src/PVE/API2/AccessControl.pm `permissions`: `{path: {privilege: propagate}}` for the calling identity; a
privilege-separated token's answer is what the token itself may do), once per ACL path pvegpu's calls on
this node are checked on: each `path` of `pvegpu.models.pve_privileges.PVE_PRIVILEGES` with this node's own
ids filled in (its VM's and container's vmid, the storages its specs name, its PCI mapping ids, the VM's
bridge, the node, the model store's directory mapping). A privilege absent from a path's answer is missing
there; its propagate flag does not matter (it is held on that path).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.model import SHARE_ID
from pvegpu.models.pve_privileges import PVE_PRIVILEGES, PvePrivilege
from pvegpu.models.specs import HostSpecs
from pvegpu.models.vm import ImageUrl

_PLACEHOLDER = re.compile(r"\{(vmid|storage|id|node|bridge|dirid)\}")


@dataclass(frozen=True)
class PrivilegeAt:
    """Privilege `name` needed on ACL `path` (a path of this node, ids filled in), and `why`."""

    name: str
    path: str
    why: str


def node_ids(specs: HostSpecs, mapping_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """This node's ids per placeholder of a privilege path: `vmid`, `storage`, `id`, `node`, `bridge`,
    `dirid` (the model store's directory mapping, with `vm` and `model` data)."""
    vm, lxc = specs.vm, specs.lxc
    vmids = [str(guest.vmid) for guest in (vm, lxc) if guest is not None]
    storages: list[str] = []
    if vm is not None:
        storages += [vm.disk.storage, vm.snippets_storage]
        if isinstance(vm.image, ImageUrl):
            storages.append(vm.image.storage)
    if lxc is not None:
        storages.append(lxc.storage)
    return {
        "vmid": tuple(dict.fromkeys(vmids)),
        "storage": tuple(dict.fromkeys(storages)),
        "id": tuple(mapping_ids),
        "node": (specs.node.name,),
        "bridge": () if vm is None else (vm.net.bridge,),
        "dirid": (SHARE_ID,) if vm is not None and specs.model is not None else (),
    }


def required_privileges(
    ids: Mapping[str, Sequence[str]], privileges: Sequence[PvePrivilege] = PVE_PRIVILEGES
) -> tuple[PrivilegeAt, ...]:
    """Each privilege on each of this node's paths of its kind (`ids` from `node_ids`); a path whose id
    this node does not have (no container: no second vmid; no mapping yet) is not checked."""
    needed: list[PrivilegeAt] = []
    for privilege in privileges:
        match = _PLACEHOLDER.search(privilege.path)
        values = [None] if match is None else ids.get(match[1], ())
        for value in values:
            path = privilege.path if match is None else _PLACEHOLDER.sub(str(value), privilege.path)
            needed.append(PrivilegeAt(privilege.name, path, privilege.why))
    return tuple(needed)


def acl_paths(required: Sequence[PrivilegeAt]) -> tuple[str, ...]:
    """The paths to read (`GET /access/permissions?path=...`), each once, in order."""
    return tuple(dict.fromkeys(privilege.path for privilege in required))


def missing_privileges(
    required: Sequence[PrivilegeAt], granted: Mapping[str, frozenset[str]]
) -> tuple[PrivilegeAt, ...]:
    """The privileges of `required` that `granted` (path -> privileges held there) does not hold."""
    return tuple(p for p in required if p.name not in granted.get(p.path, frozenset()))


def privileges_report(token_id: str, required: Sequence[PrivilegeAt], missing: Sequence[PrivilegeAt]) -> str:
    """The doctor's sentence: all held, or one line per missing privilege with its path and why."""
    paths = len(acl_paths(required))
    if not missing:
        return f"API token {token_id}: holds all {len(required)} privileges pvegpu needs on {paths} paths"
    lines = "".join(f"\n  {p.name} on {p.path}: {p.why}" for p in missing)
    return (
        f"API token {token_id}: lacks {len(missing)} of the {len(required)} privileges pvegpu needs "
        f"(README, Security: the pveum recipe grants them):{lines}"
    )
