"""Cluster PCI mappings from every node's GPUs, and what to change in the mappings Proxmox holds. Pure.

`plan_mappings({node: Topology})` gives one mapping per GPU index (`gpu0`, `gpu1`, ... with the default
prefix), each with one `map` entry per node, sorted by node name:

    id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:204b

- The index is the topology's physical order (`Topology.order_key`), so gpuN names the same card after a
  BIOS change renumbers buses and groups; only the entry's path and group change.
- `path` is the function-less slot address, so the GPU and its HDMI audio go to the VM together;
  Proxmox checks function .0 of it, which must therefore be the GPU itself. A GPU that gets a GPUDirect
  clique (`single_function`, per node: the hostpci indexes of the node's VM, plan/p2p.py) is mapped by its
  display function, `path=0000:41:00.0`: qemu-server then passes that one function and names the device
  `hostpciN`, which QEMU's `-set` can address (a multifunction slot's `hostpciN.0` it cannot). Its HDMI audio
  function stays on the host, bound to vfio-pci with the rest of the group and used by nobody.
- `id` is the lowercase vendor:device and `subsystem-id`/`iommugroup` are always written: Proxmox's live
  check fails an entry that lacks a property the hardware reports.
Refused: a node whose topology is not ok (a refused GPU, a count problem) and nodes that disagree on the
number or model of GPUs; `MappingPlanError` names every problem.

`diff_mappings(desired, current, prefix, cluster=nodes)` compares with the mappings the API lists, touching
only ids of pvegpu's scheme (`<prefix><N>`): anything else is someone else's and is never created, updated or
deleted. Inside a managed mapping, a map line of a node outside `cluster` (the inventory's nodes this mapping
is planned for) belongs to someone else too: it is kept verbatim, and an update writes it back unchanged.
With `owner`, a managed mapping also carries pvegpu's mark in its `description` (plan/ownership.py): created
with it, and one without it (`MappingChange.mark` not ours) is the caller's to refuse or adopt: adopting is
an UPDATE that writes the mark, the operator's description text kept.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from pvegpu.models.pve import CONFIG_ID, MapEntry, MapEntryError, PciMapping, parse_map_entry
from pvegpu.plan.errors import PlanError
from pvegpu.plan.ownership import Mark, mapping_description, mapping_mark
from pvegpu.plan.topology import Topology, Verdict

DEFAULT_PREFIX = "gpu"


class MappingPlanError(PlanError):
    """The nodes' GPUs cannot be mapped; `problems` holds one sentence per problem (also the message)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


def mapping_id(prefix: str, index: int) -> str:
    """`gpu3` for ("gpu", 3); ValueError when the result is not a Proxmox mapping id."""
    name = f"{prefix}{index}"
    if not CONFIG_ID.fullmatch(name):
        raise ValueError(f"mapping prefix {prefix!r} gives {name!r}, not a Proxmox mapping id")
    return name


def managed_index(prefix: str, name: str) -> int | None:
    """N when `name` is `<prefix><N>` (pvegpu's scheme), else None (someone else's mapping)."""
    match = re.fullmatch(re.escape(prefix) + r"(0|[1-9][0-9]{0,8})", name)  # int() refuses 4300+ digits
    return None if match is None else int(match[1])


def plan_mappings(
    topologies: Mapping[str, Topology],
    prefix: str = DEFAULT_PREFIX,
    single_function: Mapping[str, Collection[int]] | None = None,
) -> tuple[PciMapping, ...]:
    """One mapping per GPU index over every node (see the module docstring); `single_function`: per node,
    the GPU indexes mapped by their display function (`.0`) instead of the whole slot. Raises
    MappingPlanError."""
    single = single_function or {}
    if not topologies:
        raise MappingPlanError(["no node to map"])
    nodes = sorted(topologies)
    problems = [problem for node in nodes for problem in _node_problems(node, topologies[node])]
    if not problems:
        problems = _disagreements(nodes, topologies)
    if problems:
        raise MappingPlanError(problems)
    count = len(topologies[nodes[0]].gpus)
    mappings = []
    for index in range(count):
        entries = []
        for node in nodes:
            gpu = topologies[node].gpus[index]
            entries.append(
                MapEntry(
                    node=node,
                    path=slot_path(gpu.address, index in single.get(node, ())),
                    id=gpu.id,
                    subsystem_id=gpu.subsystem_id,
                    iommugroup=gpu.iommu_group,
                )
            )
        mappings.append(PciMapping(id=mapping_id(prefix, index), map=tuple(e.text for e in entries)))
    return tuple(mappings)


def slot_path(slot: str, single_function: bool) -> str:
    """A map line's path for the card in `slot` (`0000:41:00`): the slot (every function), or its display
    function `0000:41:00.0` when it is passed single-function."""
    return f"{slot}.0" if single_function else slot


def with_path_shape(mapping: PciMapping, node: str, single_function: bool) -> PciMapping:
    """`mapping` with `node`'s map line naming its slot single-function (`.0`) or whole; every other line, a
    line already of that shape, and a line that does not parse or holds a `;`-list of paths (not pvegpu's
    shape), byte for byte."""
    lines = []
    for text in mapping.map:
        try:
            entry = parse_map_entry(text)
        except MapEntryError:
            lines.append(text)
            continue
        path = slot_path(re.sub(r"\.[0-9a-f]$", "", entry.path), single_function)
        if entry.node != node or len(entry.paths) != 1 or path == entry.path:
            lines.append(text)
            continue
        lines.append(replace(entry, path=path).text)
    return replace(mapping, map=tuple(lines))


def _node_problems(node: str, topology: Topology) -> list[str]:
    problems = [f"{node}: {problem}" for problem in topology.problems]
    for gpu in topology.gpus:
        if gpu.verdict is Verdict.REFUSED:
            problems.append(f"{node}: {gpu.name} {gpu.address} ({gpu.id}) is refused: {gpu.reason}")
        elif gpu.gpu_function != f"{gpu.address}.0":
            problems.append(
                f"{node}: {gpu.name} {gpu.address}: the GPU is function {gpu.gpu_function}, "
                "but Proxmox checks function .0 of a mapped slot"
            )
    return problems


def _disagreements(nodes: list[str], topologies: Mapping[str, Topology]) -> list[str]:
    counts = {node: len(topologies[node].gpus) for node in nodes}
    if len(set(counts.values())) > 1:
        seen = ", ".join(f"{node} has {counts[node]}" for node in nodes)
        return [f"nodes disagree on the number of GPUs: {seen}"]
    problems = []
    for index in range(counts[nodes[0]]):
        models = {node: topologies[node].gpus[index].id for node in nodes}
        if len(set(models.values())) > 1:
            seen = ", ".join(f"{node} has {models[node]}" for node in nodes)
            problems.append(f"nodes disagree on the model of GPU {index}: {seen}")
    return problems


class Action(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class MappingChange:
    """What to do with one desired mapping: `map` is the whole map it must hold (the planned entries and the
    kept ones); `current` the entries Proxmox holds now (None for CREATE); `kept` the current entries of
    nodes outside the inventory's cluster, which `map` carries verbatim; `description` the description it
    must hold (None: left as it is, no `owner`); `mark` what the current one says of its owner (None for a
    CREATE or without `owner`)."""

    action: Action
    id: str
    map: tuple[str, ...]
    current: tuple[str, ...] | None
    kept: tuple[str, ...] = ()
    description: str | None = None
    mark: Mark | None = None


def diff_mappings(
    desired: Sequence[PciMapping],
    current: Sequence[PciMapping],
    prefix: str = DEFAULT_PREFIX,
    *,
    cluster: Collection[str],
    owner: str | None = None,
) -> tuple[MappingChange, ...]:
    """CREATE / UPDATE / UNCHANGED per desired mapping, in desired order.

    `cluster` is the node names the desired mappings are planned for. A current entry of any other node is
    kept (someone else's line: a node pvegpu does not manage here); entries of `cluster` nodes are replaced
    by the plan's. The resulting map is sorted by node. Entries are compared by meaning (keys and values),
    not by text or line order, so a mapping someone wrote in the GUI's key order is unchanged when it says
    the same. An entry that does not parse names no node for sure, counts as different and is replaced.
    Current mappings outside the prefix scheme, and managed ones no longer desired, are left alone.
    Raises ValueError when a desired id is not of the prefix scheme (it would not be pvegpu's). With
    `owner`, the description that marks it (module docstring) is compared too.
    """
    held = {mapping.id: mapping for mapping in current}
    changes = []
    for mapping in desired:
        if managed_index(prefix, mapping.id) is None:
            raise ValueError(f"mapping {mapping.id!r} is not of pvegpu's scheme {prefix}<N>")
        now = held.get(mapping.id)
        if now is None:
            description = None if owner is None else mapping_description(None, owner)
            changes.append(MappingChange(Action.CREATE, mapping.id, mapping.map, None, (), description))
            continue
        kept = tuple(text for text in now.map if _node_of(text) not in (None, *cluster))
        whole = tuple(sorted(mapping.map + kept, key=lambda text: _node_of(text) or ""))
        same = _meaning(now.map) == _meaning(whole)
        description = mark = None
        if owner is not None:
            description, mark = (
                mapping_description(now.description, owner),
                mapping_mark(now.description, owner),
            )
            same = same and description == now.description
        action = Action.UNCHANGED if same else Action.UPDATE
        changes.append(MappingChange(action, mapping.id, whole, now.map, kept, description, mark))
    return tuple(changes)


def _node_of(text: str) -> str | None:
    """The node an entry is for; None when it does not parse."""
    try:
        return parse_map_entry(text).node
    except MapEntryError:
        return None


def _meaning(entries: tuple[str, ...]) -> list[tuple[str, ...]] | None:
    try:
        parsed = [parse_map_entry(entry) for entry in entries]
    except MapEntryError:
        return None
    return sorted(tuple(str(value) for value in vars(entry).values()) for entry in parsed)
