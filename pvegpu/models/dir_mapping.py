"""A cluster directory mapping (`/cluster/mapping/dir`, /etc/pve/mapping/directory.cfg) as Proxmox holds
it. Plain data.

pve-guest-common PVE::Mapping::Dir: one section per mapping id (a bare id header, as pci.cfg), one `map` line
per node (`node=<node>,path=<absolute directory>`), an optional `description`. A VM's `virtiofsN: <id>`
shares the directory of its node's line (qemu-server QemuServer/Virtiofs.pm, checked at the VM's start).
"""

from __future__ import annotations

from dataclasses import dataclass

DIRECTORY_CFG = "/etc/pve/mapping/directory.cfg"  # Mapping/Dir.pm $FILENAME


@dataclass(frozen=True)
class DirMapping:
    """One directory mapping: its `id`, its `map` lines verbatim (in order), its `description`."""

    id: str
    map: tuple[str, ...]
    description: str | None = None


@dataclass(frozen=True)
class DirMappingState:
    """A mapping as read, with the `digest` of the whole directory.cfg (what a PUT must send back)."""

    mapping: DirMapping
    digest: str


def dir_map_entry(text: str) -> dict[str, str]:
    """A `map` line's keys and values (`node=pve1,path=/srv/models` -> {node, path}); a part without `=` is
    kept under its own text with an empty value (Proxmox refuses such a line: pvegpu never takes it for
    a node's)."""
    entry: dict[str, str] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        entry.setdefault(key.strip(), value.strip())
    return entry
