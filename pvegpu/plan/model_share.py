"""The model store on a Proxmox node as the VM sees it: the directory mapping `pvegpu-models` and the VM's
`virtiofs0`. Pure.

With `model` data (pvegpu/models/model.py `ModelSpec`) on a node of the `vm` profile, pvegpu makes the cluster
directory mapping `SHARE_ID` (`/cluster/mapping/dir`, /etc/pve/mapping/directory.cfg) map this node to the
store's directory (`map node=<node>,path=<ModelSpec.path>`; other nodes' lines kept verbatim) and gives the
VM `virtiofs0: pvegpu-models`: Proxmox's defaults, nothing more (qemu-server QemuServer/Virtiofs.pm
$virtiofs_fmt: `cache` auto, `direct-io`, `expose-xattr`, `expose-acl` off); the guest mounts the tag
`pvegpu-models`. Proxmox starts a virtiofsd for it at the VM's start and checks the mapping then
(`find_on_current_node`: `No directory mapping for node <node>.`).

Only with qemu-server 8.3.11 or later (debian/changelog: "fix #1027: add support for shared mounts using
Virtiofs"; Proxmox VE 8.4): below it there is no mapping and no `virtiofs0`, and the VM's guest fetches the
model itself (`no_virtiofs_line`). An unknown version counts as having it.

Ownership: the mapping pvegpu creates carries `pvegpu-owner: <owner>` in its description (plan/ownership.py);
one without any `pvegpu-owner:` line is someone else's and refused (`foreign_line`), never rewritten. One that
another pvegpu inventory marked (another owner in the same cluster) is shared: pvegpu writes its node's line
and keeps the description.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pvegpu.models.dir_mapping import DirMapping, dir_map_entry
from pvegpu.models.model import SHARE_ID
from pvegpu.plan.ownership import mapping_description, owners_of

# qemu-server 8.3.11 (Proxmox VE 8.4) added virtiofsN (debian/changelog: "fix #1027: add support for shared
# mounts using Virtiofs").
VIRTIOFS_SINCE = (8, 3, 11)
MAX_VIRTIOFS = 10  # Virtiofs.pm $MAX_VIRTIOFS: virtiofs0..virtiofs9
VIRTIOFS_KEY = "virtiofs0"
DESCRIPTION = "pvegpu model store"


def virtiofs_available(qemu_server: tuple[int, int, int] | None) -> bool:
    """Whether a node's qemu-server (major, minor, patch) has virtiofs (8.3.11+); None (unknown) counts as
    having it."""
    return qemu_server is None or qemu_server >= VIRTIOFS_SINCE


def no_virtiofs_line(qemu_server: tuple[int, int, int]) -> str:
    """What the run says on a node whose qemu-server has no virtiofs."""
    version = ".".join(map(str, qemu_server))
    return (
        f"model: qemu-server {version} has no virtiofs (Proxmox VE 8.4+): the VM's guest fetches the model "
        "itself"
    )


def guest_fetch_line(qemu_server: tuple[int, int, int], model_path: str) -> str:
    """What a VM guest's run says when its node's qemu-server has no virtiofs: it fetches the model."""
    version = ".".join(map(str, qemu_server))
    return (
        f"model: the node's qemu-server {version} has no virtiofs (Proxmox VE 8.4+): fetched into "
        f"{model_path} here, verified as on the node"
    )


@dataclass(frozen=True)
class ModelShare:
    """The store a node's VM gets through virtiofs: the mapping `id` and the directory `path` on the node."""

    path: str
    id: str = SHARE_ID

    def entry(self, node: str) -> str:
        """This node's `map` line: `node=<node>,path=<path>` (Mapping/Dir.pm $map_fmt)."""
        return f"node={node},path={self.path}"


def virtiofs_dirid(value: object) -> str | None:
    """The `dirid` of a `virtiofsN` value (its default key: `pvegpu-models,cache=auto` -> `pvegpu-models`)."""
    if value is None:
        return None
    for part in str(value).split(","):
        key, sep, rest = part.partition("=")
        if not sep:
            return key.strip()
        if key.strip() == "dirid":
            return rest.strip()
    return None


class DirAction(Enum):
    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"
    FOREIGN = "foreign"


@dataclass(frozen=True)
class DirMappingChange:
    """What to do with the mapping: `map` and `description` the whole mapping to send (CREATE, UPDATE);
    `current` the map lines it holds now (None: absent); FOREIGN: it exists without pvegpu's mark."""

    action: DirAction
    mapping: DirMapping
    current: tuple[str, ...] | None


def diff_dir_mapping(held: DirMapping | None, share: ModelShare, node: str, owner: str) -> DirMappingChange:
    """The change that makes `held` (None: absent) map `node` to `share.path` (module docstring): this node's
    line(s) replaced by one, in place (appended when it had none), every other line kept verbatim."""
    line = share.entry(node)
    if held is None:
        wanted = DirMapping(share.id, (line,), mapping_description(DESCRIPTION, owner))
        return DirMappingChange(DirAction.CREATE, wanted, None)
    if not owners_of(held.description):
        return DirMappingChange(DirAction.FOREIGN, held, held.map)
    ours = [text for text in held.map if dir_map_entry(text).get("node") == node]
    entries = [dir_map_entry(text) for text in ours]
    if len(entries) == 1 and entries[0].get("path") == share.path and set(entries[0]) == {"node", "path"}:
        return DirMappingChange(DirAction.UNCHANGED, held, held.map)
    kept: list[str] = []
    for text in held.map:
        if text not in ours:
            kept.append(text)
        elif line not in kept:
            kept.append(line)
    if line not in kept:
        kept.append(line)
    return DirMappingChange(DirAction.UPDATE, DirMapping(held.id, tuple(kept), held.description), held.map)


def foreign_line(mapping_id: str, node: str, description: str | None) -> str:
    """The one line that refuses a mapping `mapping_id` pvegpu did not make."""
    found = "no description" if not description else f"description {description!r}"
    return (
        f"directory mapping {mapping_id} is not pvegpu's ({found}, no pvegpu-owner: line): left as it is, "
        f"the model store not shared with the VM on {node}; remove it (pvesh delete "
        f"/cluster/mapping/dir/{mapping_id}) or add a pvegpu-owner: line to its description"
    )
