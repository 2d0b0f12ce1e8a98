"""What marks a guest or a PCI mapping as pvegpu's, and what to write to mark it. Pure.

The mark is kept by Proxmox itself, so it is there for every run, from any operator's machine:

- a guest (the VM, the container): the tag `pvegpu` in its `tags` and the line `pvegpu-owner: <owner>` in
  its `description` (the notes the GUI shows);
- a `<prefix>N` PCI mapping: the line `pvegpu-owner: <owner>` in its `description`.

`<owner>` is `pve.owner`, else `pve.cluster`, else `node.name` (`owner_id`): the id of the inventory that
manages the cluster. Two inventories that manage one cluster set different `pve.owner`s.

pvegpu converges, parks, stops, unlocks or destroys only what carries its mark with its owner. Whatever else
sits at `vm.vmid` / `lxc.vmid` or a `<prefix>N` id is someone else's: refused (`refusal`) unless the
inventory says to adopt it (`vm.adopt`, `lxc.adopt`, `mapping.adopt`), and adopting writes the mark
(`guest_mark_keys`, `mapping_description`), so the next run needs no switch. An operator's own tags and
description text are kept.

Proxmox's tag rules (pve-guest-common GuestHelpers.pm): a tag list is split on `;`, `,` and spaces, stored
deduplicated, sorted and lowercased (`get_unique_tags`; tags are case-insensitive unless datacenter
`tag-style` says otherwise); setting a tag needs VM.Config.Options on the guest, and a tag the datacenter's
`user-tag-access` does not allow (or a `registered-tags` one) needs Sys.Modify on `/`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TAG = "pvegpu"
OWNER_PREFIX = "pvegpu-owner: "
MAPPING_SWITCH = "mapping.adopt"  # the switch that adopts a `<prefix>N` mapping without the mark
_SPLIT = re.compile(r"[;,\s]+")
_OWNER = re.compile(rf"{OWNER_PREFIX}([A-Za-z0-9][A-Za-z0-9_-]*)")


def owner_id(owner: str | None, cluster: str | None, node: str) -> str:
    """The id pvegpu marks with: `pve.owner`, else `pve.cluster`, else the node's name."""
    return owner or cluster or node


def owner_line(owner: str) -> str:
    """`pvegpu-owner: <owner>`: the description line that names the inventory a guest or mapping is of."""
    return f"{OWNER_PREFIX}{owner}"


def tags_of(value: object) -> tuple[str, ...]:
    """A `tags` value as Proxmox splits it (split_list), empty for None."""
    return tuple(tag for tag in _SPLIT.split("" if value is None else str(value)) if tag)


def owners_of(description: object) -> tuple[str, ...]:
    """The owners a description names, one per `pvegpu-owner: <id>` in it, in order."""
    return tuple(_OWNER.findall("" if description is None else str(description)))


@dataclass(frozen=True)
class Mark:
    """What a guest's or mapping's config says of its owner: `ours` when it carries the mark with `owner`;
    `found` what it carries instead (for messages): `no pvegpu mark`, `pvegpu-owner: other`, ..."""

    ours: bool
    found: str


def guest_mark(values: Mapping[str, object], owner: str) -> Mark:
    """Whether guest config `values` carries pvegpu's mark for `owner` (tag and description line)."""
    tagged = TAG in (tag.lower() for tag in tags_of(values.get("tags")))
    owners = owners_of(values.get("description"))
    if tagged and owner in owners:
        return Mark(True, f"tag {TAG}, {owner_line(owner)}")
    return Mark(False, _found(tagged, owners))


def mapping_mark(description: str | None, owner: str) -> Mark:
    """Whether a mapping's `description` carries pvegpu's mark for `owner`."""
    owners = owners_of(description)
    if owner in owners:
        return Mark(True, owner_line(owner))
    return Mark(False, _found(None, owners))


def _found(tagged: bool | None, owners: tuple[str, ...]) -> str:
    if owners:
        named = ", ".join(owner_line(other) for other in owners)
        return f"{named} without the tag {TAG}" if tagged is False else named
    if tagged:
        return f"tag {TAG} without a {OWNER_PREFIX.strip()} line"
    return "no pvegpu mark"


def guest_mark_keys(values: Mapping[str, object], owner: str) -> dict[str, str]:
    """The `tags` and `description` that mark guest `values` as `owner`'s, keeping the operator's tags and
    text (another owner's line replaced); only the keys that must change (empty when it is marked)."""
    keys: dict[str, str] = {}
    tags = tags_of(values.get("tags"))
    if TAG not in (tag.lower() for tag in tags):
        keys["tags"] = unique_tags((*tags, TAG))
    description = marked_description(
        None if values.get("description") is None else str(values["description"]), owner
    )
    if description != values.get("description"):
        keys["description"] = description
    return keys


def unique_tags(tags: tuple[str, ...]) -> str:
    """Proxmox's stored form of a tag list (get_unique_tags, default tag-style): lowercased, deduplicated,
    sorted, joined by `;`."""
    return ";".join(sorted({tag.lower() for tag in tags}))


def marked_description(description: str | None, owner: str) -> str:
    """`description` with exactly one owner line, `owner`'s: another owner's line replaced, the operator's
    text kept; unchanged when it already names `owner` alone."""
    lines = [] if not description else description.splitlines()
    if owners_of(description) == (owner,):
        return description or owner_line(owner)
    kept = [line for line in lines if not line.strip().startswith(OWNER_PREFIX)]
    return "\n".join([*kept, owner_line(owner)])


def mapping_description(description: str | None, owner: str) -> str:
    """A mapping's one-line `description` (pci.cfg holds one line) naming `owner` alone: the operator's text
    kept, another owner's id dropped, ` pvegpu-owner: <owner>` appended; unchanged when it names `owner`
    alone already."""
    if owners_of(description) == (owner,):
        return description or owner_line(owner)
    kept = " ".join(_OWNER.sub("", description or "").split())
    return f"{kept} {owner_line(owner)}" if kept else owner_line(owner)


def refusal(what: str, node: str, mark: Mark, switch: str) -> str:
    """The one line that refuses `what` (`VM 100`, `CT 200`, `mapping gpu0`): it names it, what it carries
    and the adopt switch."""
    return (
        f"{what} on {node} is not pvegpu's ({mark.found}): left as it is; to let pvegpu manage it, set "
        f"{switch}: true (adopting writes pvegpu's mark)"
    )
