"""After a BIOS change: which of a node's GPU mappings pvegpu may repair, and which it must refuse. Pure.

`plan_heal(node, sections, hardware, prefix, owner)` compares this node's `map` line of each managed mapping
(`<prefix><N>`, one line per node, as `plan/mapping.py` writes them) with the node's live GPUs and decides
per GPU:

- `unchanged`: the line still describes its card (path, ids, group), and the card's group holds nothing
  but the card and bridges;
- `repaired`: renumber-only drift. The same card in the same physical position, with the same vendor:device
  and subsystem ids; only its bus number and IOMMU group changed. The new line keeps the old one's
  description and the shape of its path (function-less or `.F`);
- `refused`, with what changed: a card missing or added, moved, another model or subsystem, a group that
  now holds another endpoint, or a line pvegpu cannot read as its own (none or several for the node,
  a `;`-list of paths: one device set that pvegpu does not write).

The physical position. pci.cfg records bus addresses and groups, not slots, so a line's position is its
index: gpuN was written for the Nth card in physical order (`Topology.order_key`: the firmware's slot
numbers where it names a distinct one for every card, else the root complex's place in NUMA order and the
address below it). So drift is repairable only when the node still has exactly one card per mapped
index, and each line's card is the one now at its index. Contradictions refuse:
- another number of cards than of lines (a card missing or added): only lines whose card is still exactly
  where they say are unchanged; every other line is refused, saying what its address holds now;
- a line that still exactly describes a card at another index (the cards around it moved);
- another device number of the card's slot, the one part of the path below its port a line records.
A card moved to another slot while keeping its place in the order is invisible to this check.

Only pvegpu's own mappings are repaired. With `owner` (the node's hook always gives it; `pvegpu mapping
--against` with `--owner`), a drifted line of a mapping whose description lacks `pvegpu-owner: <owner>`
(plan/ownership.py) is refused, naming the mapping and `mapping.adopt` (`HealPlan.unowned`).

When any GPU of the node is refused, nothing of this node is repaired (the VM cannot start anyway, and
the operator checks the hardware, or adopts the mapping, first): its drifted lines are refused too, naming
the repair they would get. The live GPUs are every display function of the vendors the lines name,
whatever the model, so a card swapped for another model is seen in its position. Map lines of other
nodes, and sections outside the scheme, are returned byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import MapEntry, MapEntryError, PciMapping, parse_map_entry
from pvegpu.plan.mapping import DEFAULT_PREFIX, managed_index
from pvegpu.plan.ownership import MAPPING_SWITCH, Mark, mapping_mark
from pvegpu.plan.topology import GpuCard, Selected, Verdict, describe, display_ids, plan_topology


class Status(StrEnum):
    UNCHANGED = "unchanged"
    REPAIRED = "repaired"
    REFUSED = "refused"


class Health(StrEnum):
    """A node's mappings in one word: what the doctor reports."""

    VALID = "valid"
    DRIFT = "renumber-only drift"
    CHANGED = "hardware changed"


@dataclass(frozen=True)
class GpuHeal:
    """The decision for one managed mapping on one node.

    `text` is the node's map line as Proxmox holds it (None when the section has none or several for the
    node), `current` that line parsed; `repaired` the line pvegpu writes instead (REPAIRED; for a drifted
    line refused because another GPU changed, the repair it would have made); `reason` says, for REFUSED,
    what changed and why it is not repaired.
    """

    mapping: str
    node: str
    status: Status
    text: str | None
    current: MapEntry | None
    repaired: MapEntry | None = None
    reason: str | None = None

    @property
    def line(self) -> str:
        """`gpu3 pve1: unchanged`, `gpu3 pve1: 0000:71:00 group 23 -> 0000:72:00 group 41, repaired`, or
        `gpu3 pve1: <what changed and why>, not repaired`."""
        if self.status is Status.UNCHANGED:
            return f"{self.mapping} {self.node}: unchanged"
        if self.status is Status.REPAIRED and self.current and self.repaired:
            return f"{self.mapping} {self.node}: {renumbering(self.current, self.repaired)}, repaired"
        return f"{self.mapping} {self.node}: {self.reason}, not repaired"

    @property
    def finding(self) -> str:
        """What is, without what is done: `gpu3 pve1: valid`, `gpu3 pve1: 0000:71:00 group 23 ->
        0000:72:00 group 41 (renumbered)`, or `gpu3 pve1: <what changed>`."""
        if self.status is Status.UNCHANGED:
            return f"{self.mapping} {self.node}: valid"
        if self.status is Status.REPAIRED and self.current and self.repaired:
            return f"{self.mapping} {self.node}: {renumbering(self.current, self.repaired)} (renumbered)"
        return f"{self.mapping} {self.node}: {self.reason}"


@dataclass(frozen=True)
class HealPlan:
    """The decisions for one node: one per managed mapping (by index), the node's GPUs no mapping names
    (`added`, one sentence each), and `sections`: the sections given, with this node's repaired lines
    replaced in place (every other line, and every section outside the scheme, as given). `unowned`: the
    mappings whose renumbering is refused only because they lack pvegpu's mark (module docstring)."""

    node: str
    gpus: tuple[GpuHeal, ...]
    added: tuple[str, ...]
    sections: tuple[PciMapping, ...]
    unowned: tuple[str, ...] = ()

    @property
    def hardware_changed(self) -> bool:
        """True when a GPU is refused for what the hardware is, or added; False when nothing is refused, or
        only for a missing mark (checked only when the hardware allows every repair)."""
        return not self.ok and not self.unowned

    @property
    def ok(self) -> bool:
        """True when nothing is refused: every GPU unchanged or repaired, none added."""
        return not self.added and all(gpu.status is not Status.REFUSED for gpu in self.gpus)

    @property
    def findings(self) -> tuple[str, ...]:
        """`GpuHeal.finding` per GPU, then one line per added card: `pve1: <sentence>`."""
        return tuple(gpu.finding for gpu in self.gpus) + tuple(f"{self.node}: {s}" for s in self.added)

    @property
    def health(self) -> Health:
        """CHANGED when anything is refused, DRIFT when something is repaired, else VALID."""
        if not self.ok:
            return Health.CHANGED
        if any(gpu.status is Status.REPAIRED for gpu in self.gpus):
            return Health.DRIFT
        return Health.VALID

    @property
    def lines(self) -> tuple[str, ...]:
        """One line per GPU (`GpuHeal.line`), then one per added card: `pve1: <sentence>, not repaired`."""
        return tuple(gpu.line for gpu in self.gpus) + tuple(
            f"{self.node}: {sentence}, not repaired" for sentence in self.added
        )


def renumbering(old: MapEntry, new: MapEntry) -> str:
    """`0000:71:00 group 23 -> 0000:72:00 group 41`."""
    return f"{where(old)} -> {where(new)}"


def where(entry: MapEntry) -> str:
    return f"{entry.path} group {entry.iommugroup}"


@dataclass(frozen=True)
class _Line:
    mapping: PciMapping
    index: int
    text: str
    entry: MapEntry


def plan_heal(
    node: str,
    sections: Sequence[PciMapping],
    hw: HostHardware,
    prefix: str = DEFAULT_PREFIX,
    owner: str | None = None,
) -> HealPlan:
    """Decide per managed mapping of `sections` whether `node`'s line is unchanged, repaired or refused
    on the node's live hardware `hw` (see the module docstring); with `owner`, a repair only of a mapping
    marked `pvegpu-owner: <owner>`."""
    managed = sorted(
        ((index, s) for s in sections if (index := managed_index(prefix, s.id)) is not None),
        key=lambda pair: pair[0],
    )
    decided: dict[str, GpuHeal] = {}
    lines: list[_Line] = []
    for index, section in managed:
        line_or_refusal = _node_line(node, index, section)
        if isinstance(line_or_refusal, GpuHeal):
            decided[section.id] = line_or_refusal
        else:
            lines.append(line_or_refusal)
    cards = _live_cards(hw, {line.entry.id.split(":")[0].lower() for line in lines})
    added: tuple[str, ...] = ()
    if [line.index for line in lines] == list(range(len(cards))) and not decided:
        decided.update(_by_position(node, lines, cards))
    else:
        found = _count_change(len(cards), len(managed), node)
        decided.update(_by_address(node, lines, cards, hw, found))
        added = _added(lines, cards, found) if len(cards) > len(managed) else ()
    if added or any(gpu.status is Status.REFUSED for gpu in decided.values()):
        decided = {name: _held(gpu, f"another GPU of {node} changed") for name, gpu in decided.items()}
    unowned: list[str] = []
    if owner is not None:
        for _, section in managed:
            gpu, mark = decided[section.id], mapping_mark(section.description, owner)
            if gpu.status is Status.REPAIRED and not mark.ours:
                decided[section.id] = _unowned(gpu, mark)
                unowned.append(section.id)
    if unowned:
        why = f"{', '.join(unowned)} of {node} {'is' if len(unowned) == 1 else 'are'} not pvegpu's"
        decided = {name: _held(gpu, why) for name, gpu in decided.items()}
    gpus = tuple(decided[section.id] for _, section in managed)
    repaired = tuple(_repaired_section(s, decided.get(s.id)) for s in sections)
    return HealPlan(node, gpus, added, repaired, tuple(unowned))


def _node_line(node: str, index: int, section: PciMapping) -> _Line | GpuHeal:
    texts = [text for text in section.map if (entry := _parsed(text)) is not None and entry.node == node]
    if len(texts) != 1:
        why = f"no map line for {node}" if not texts else f"{len(texts)} map lines for {node}"
        return GpuHeal(section.id, node, Status.REFUSED, None, None, reason=f"{why}: pvegpu writes one")
    entry = parse_map_entry(texts[0])
    if len(entry.paths) > 1:
        return GpuHeal(
            section.id,
            node,
            Status.REFUSED,
            texts[0],
            entry,
            reason=f"path {entry.path} names {len(entry.paths)} devices passed together: pvegpu writes one",
        )
    return _Line(section, index, texts[0], entry)


def _parsed(text: str) -> MapEntry | None:
    try:
        return parse_map_entry(text)
    except MapEntryError:
        return None  # Proxmox drops such a line when it reads the file


def _live_cards(hw: HostHardware, vendors: set[str]) -> tuple[GpuCard, ...]:
    ids = tuple(pci_id for vendor in sorted(vendors) for pci_id in display_ids(hw, vendor))
    return plan_topology(hw, Selected(ids=ids)).gpus if ids else ()


def _by_position(node: str, lines: list[_Line], cards: tuple[GpuCard, ...]) -> dict[str, GpuHeal]:
    """One card per mapped index: each line against the card now at its index."""
    decided = {}
    for line in lines:
        card, entry = cards[line.index], line.entry
        elsewhere = [i for i, other in enumerate(cards) if i != line.index and _exact(entry, other)]

        def refused(reason: str, line: _Line = line) -> GpuHeal:
            return GpuHeal(line.mapping.id, node, Status.REFUSED, line.text, line.entry, reason=reason)

        if _exact(entry, card):
            decided[line.mapping.id] = (
                GpuHeal(line.mapping.id, node, Status.UNCHANGED, line.text, entry)
                if card.verdict is Verdict.PASSABLE
                else refused(f"{where(entry)}: {card.reason}")
            )
        elif elsewhere:
            decided[line.mapping.id] = refused(
                f"{where(entry)} still holds its card, but that card is now GPU {elsewhere[0]} in physical "
                f"order, not {line.index}: a card was added, removed or moved"
            )
        elif not _same_model(entry, card):
            decided[line.mapping.id] = refused(
                f"{_position(card)} held {_model(entry.id, entry.subsystem_id)} at {entry.path}, now "
                f"{_model(card.id, card.subsystem_id)} at {card.address}: another "
                + ("model" if entry.id.lower() != card.id else "card of the model")
            )
        elif card.verdict is Verdict.REFUSED:
            decided[line.mapping.id] = refused(f"{where(entry)} -> {card.address}: {card.reason}")
        elif _device(entry.path) != _device(card.address):
            decided[line.mapping.id] = refused(
                f"{where(entry)} -> {card.address}: another device number in its slot path, so not the "
                "same position: the card moved"
            )
        else:
            decided[line.mapping.id] = GpuHeal(
                line.mapping.id, node, Status.REPAIRED, line.text, entry, repaired=_repair(entry, card)
            )
    return decided


def _by_address(
    node: str, lines: list[_Line], cards: tuple[GpuCard, ...], hw: HostHardware, found: str
) -> dict[str, GpuHeal]:
    """No position to pair by: a line is unchanged only when its card is exactly where it says."""
    decided = {}
    for line in lines:
        entry = line.entry
        card = next((c for c in cards if _exact(entry, c)), None)
        if card is not None and card.verdict is Verdict.PASSABLE:
            decided[line.mapping.id] = GpuHeal(line.mapping.id, node, Status.UNCHANGED, line.text, entry)
            continue
        now = _held_now(entry, cards, hw)
        decided[line.mapping.id] = GpuHeal(
            line.mapping.id, node, Status.REFUSED, line.text, entry, reason=f"{now}; {found}"
        )
    return decided


def _count_change(found: int, mapped: int, node: str) -> str:
    said = f"{found} GPUs found for {mapped} mappings of {node}"
    if found == mapped:
        return said
    return f"{said}: a card is {'missing' if found < mapped else 'added'}"


def _held_now(entry: MapEntry, cards: tuple[GpuCard, ...], hw: HostHardware) -> str:
    """What a line's address holds now, said against the line."""
    slot = _slot(entry.path)
    card = next((c for c in cards if c.address == slot), None)
    if card is not None:
        if card.verdict is Verdict.REFUSED:
            return f"{where(entry)}: {card.reason}"
        if _same_model(entry, card):
            return f"{where(entry)} -> group {card.iommu_group}"
        return f"{where(entry)} now holds {_model(card.id, card.subsystem_id)}: another card"
    function = hw.by_address.get(f"{slot}.0")
    if function is not None:
        return f"{where(entry)} now holds {describe(function)}"
    return f"{where(entry)}: no device there now"


def _added(lines: list[_Line], cards: tuple[GpuCard, ...], found: str) -> tuple[str, ...]:
    return tuple(
        f"{card.address} group {card.iommu_group} ({_model(card.id, card.subsystem_id)}, {_position(card)}) "
        f"is a GPU no mapping names; {found}"
        for card in cards
        if not any(_exact(line.entry, card) for line in lines)
    )


def _held(gpu: GpuHeal, why: str) -> GpuHeal:
    """A repair withheld because of another GPU of the node (`why`: what of it)."""
    if gpu.status is not Status.REPAIRED or gpu.current is None or gpu.repaired is None:
        return gpu
    reason = f"{renumbering(gpu.current, gpu.repaired)} is a renumbering, but {why}"
    return replace(gpu, status=Status.REFUSED, reason=reason)


def _unowned(gpu: GpuHeal, mark: Mark) -> GpuHeal:
    """A repair refused because the mapping lacks pvegpu's mark (`mark.found`: what it carries)."""
    # A REPAIRED decision holds both.
    assert gpu.current is not None
    assert gpu.repaired is not None
    reason = (
        f"{renumbering(gpu.current, gpu.repaired)} is a renumbering, but mapping {gpu.mapping} is not "
        f"pvegpu's ({mark.found}; {MAPPING_SWITCH}: true adopts it)"
    )
    return replace(gpu, status=Status.REFUSED, reason=reason)


def _repaired_section(section: PciMapping, gpu: GpuHeal | None) -> PciMapping:
    if gpu is None or gpu.status is not Status.REPAIRED or gpu.repaired is None:
        return section
    new = gpu.repaired.text
    return replace(section, map=tuple(new if text == gpu.text else text for text in section.map))


def _repair(entry: MapEntry, card: GpuCard) -> MapEntry:
    function = entry.path[len(_slot(entry.path)) :]  # "" or ".F": keep the shape of the path
    return replace(
        entry,
        path=card.address + function,
        id=card.id,
        subsystem_id=card.subsystem_id,
        iommugroup=card.iommu_group,
    )


def _exact(entry: MapEntry, card: GpuCard) -> bool:
    """The line passes Proxmox's check on this card: same slot, ids and group."""
    return (
        _slot(entry.path) == card.address
        and entry.id == card.id
        and entry.subsystem_id == card.subsystem_id
        and entry.iommugroup == card.iommu_group
    )


def _same_model(entry: MapEntry, card: GpuCard) -> bool:
    subsystem = entry.subsystem_id
    return entry.id.lower() == card.id and (subsystem is None or subsystem.lower() == card.subsystem_id)


def _slot(path: str) -> str:
    """`0000:41:00` for `0000:41:00` and `0000:41:00.1`."""
    return re.sub(r"\.[0-9a-f]$", "", path)


def _device(path: str) -> tuple[str, str]:
    """Domain and device number: `0000:41:00` -> ("0000", "00"); the bus is what a renumbering changes."""
    domain, _bus, device = _slot(path).split(":")
    return domain, device


def _model(pci_id: str, subsystem: str | None) -> str:
    return pci_id if subsystem is None else f"{pci_id} subsystem {subsystem}"


def _position(card: GpuCard) -> str:
    if card.physical_slot:
        return f"slot {card.physical_slot}"
    return f"NUMA node {card.numa_node} root bus {card.root_bus}"
