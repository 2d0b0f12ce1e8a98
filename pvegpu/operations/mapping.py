"""`pci_mappings`: the cluster's PCI mappings (`gpu0`...) made to match the GPUs of every node, via the API.

Read while the operation is prepared: `GET /cluster/mapping/pci?check-node=<node>` (Proxmox's own live check
of each mapping on this node). `diff_mappings` decides per pvegpu mapping: create (POST), update (PUT) or
unchanged; ids outside the `<prefix><N>` scheme are never touched, nor map lines of nodes outside `cluster`
(kept verbatim and logged: `gpu0 pve2: keep 0000:21:00 group 9 (10de:2bb1), not a node of this inventory's
cluster`). Each change is logged while preparing (so `--dry` shows it: per GPU and node, old -> new address
and IOMMU group) and carried out while executing by an `api_command`:

- create: `POST`; an id someone created meanwhile fails with Proxmox's `already defined` error;
- update: the mapping is read again, must still hold what was diffed (else: changed by someone else, not
  overwritten), and is PUT with the digest of that read. The digest covers the whole pci.cfg, so a
  concurrent edit anywhere in it fails the PUT with Proxmox's `detected modified configuration` error and
  nothing is written.

Every write is read back (`GET /cluster/mapping/pci/<id>`), and what is said follows what that shows, not
what the write answered: the planned map -> done (a write that failed after Proxmox wrote: a warning);
absent / unchanged -> `not created` / `not updated, nothing overwritten`, with the write's endpoint and
answer; anything else -> what it holds and what was sent; a failed read-back -> the outcome is unknown.
A failed read names the endpoint and what came back (`PveError.line`); nothing is written after it.

Ownership (with `owner`, pvegpu/plan/ownership.py): a mapping pvegpu creates carries `pvegpu-owner: <owner>`
in its description; an existing `<prefix>N` without it is refused before anything is written (one line
naming it and `mapping.adopt`), or, with `adopt`, updated with the mark (its description text kept).
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Sequence
from dataclasses import replace

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.models.pve import MapEntry, MapEntryError, MappingState, PciMapping, Severity, parse_map_entry
from pvegpu.operations.api_command import api_command, attempt, one_line_errors, what_came_back
from pvegpu.plan.mapping import Action, MappingChange, diff_mappings, managed_index
from pvegpu.plan.ownership import refusal
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError


@operation()
@one_line_errors
def pci_mappings(
    *,
    api: PveClient,
    desired: Sequence[PciMapping],
    node: str,
    prefix: str,
    cluster: Collection[str],
    owner: str | None = None,
    adopt: bool = False,
) -> Generator[FunctionCommand, None, None]:
    """Converge the mappings Proxmox holds to `desired` (from `plan_mappings` over the nodes `cluster`),
    checked on `node`; map lines of other nodes are kept. `owner` / `adopt`: pvegpu's mark (module)."""
    try:
        states = api.mappings(check_node=node)
    except PveError as error:
        raise OperationError(f"PCI mappings not read: {error.line}; nothing written") from None
    for state in states:
        _log_checks(state, node, prefix)
    changes = diff_mappings(
        desired, [state.mapping for state in states], prefix, cluster=cluster, owner=owner
    )
    refuse_foreign(changes, node, adopt)
    by_id = {mapping.id: mapping for mapping in desired}
    pending = [change for change in changes if change.action is not Action.UNCHANGED]
    # All of it is logged before the first command: change detection (--dry) stops at the first one.
    for line in [line for change in changes for line in describe_kept(change)]:
        logger.info(f"{host.print_prefix}{line}")
    for change in pending:
        for line in describe(change):
            logger.info(f"{host.print_prefix}{line}")
    for change in pending:
        whole = replace(by_id[change.id], map=change.map)
        if change.description is not None:
            whole = replace(whole, description=change.description)
        if change.action is Action.CREATE:
            yield api_command(_create, api, whole)
        else:
            yield api_command(_update, api, whole, change.current)
    if not pending:
        invalid = [s for s in states if s.mapping.id in by_id and _errors(s)]
        if invalid:
            # pvegpu's view and Proxmox's disagree: say what Proxmox sees rather than guess.
            found = "; ".join(f"{s.mapping.id}: {' '.join(_errors(s))}" for s in invalid)
            raise OperationError(
                f"the mappings match the live GPUs, but Proxmox's check on {node} fails: {found}"
            )
        ids = ", ".join(change.id for change in changes)
        host.noop(f"PCI mappings {ids} match the live GPUs and pass Proxmox's check on {node}")


def refuse_foreign(changes: Sequence[MappingChange], node: str, adopt: bool) -> None:
    """OperationError, one line naming the first mapping that exists without pvegpu's mark and
    `mapping.adopt`, unless `adopt`; roles call it while preparing too (nothing written before it)."""
    for change in changes:
        if change.mark is not None and not change.mark.ours and not adopt:
            raise OperationError(refusal(f"mapping {change.id}", node, change.mark, "mapping.adopt"))


def foreign_mappings(
    api: PveClient, desired: Sequence[PciMapping], node: str, prefix: str, *, owner: str, adopt: bool
) -> None:
    """`refuse_foreign` over the mappings Proxmox holds now (while preparing); a failed read passes: the
    operation reports it."""
    try:
        held = [state.mapping for state in api.mappings(check_node=node)]
    except PveError:
        return
    wanted = [mapping for mapping in desired if managed_index(prefix, mapping.id) is not None]
    refuse_foreign(diff_mappings(wanted, held, prefix, cluster=(), owner=owner), node, adopt)


def describe(change: MappingChange) -> list[str]:
    """One line per node entry that changes: `gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 9`."""
    new = _entries(change.map)
    if change.current is None:
        return [f"{change.id} {node}: create {_where(entry)}" for node, entry in sorted(new.items())]
    old = _entries(change.current)
    lines = []
    for node, entry in sorted(new.items()):
        before = old.get(node)
        if before is None:
            lines.append(f"{change.id} {node}: add {_where(entry)}")
        elif before != entry:
            lines.append(f"{change.id} {node}: {_where(before)} -> {_where(entry)}")
    unreadable = [text for text in change.current if _parsed(text) is None]
    lines.extend(f"{change.id}: replace unreadable entry {text!r}" for text in unreadable)
    if change.mark is not None and not change.mark.ours:
        lines.append(f"{change.id}: adopted (mapping.adopt): description {change.description!r}")
    return lines or [f"{change.id}: rewrite {len(change.map)} map entries"]


def describe_kept(change: MappingChange) -> list[str]:
    """One line per kept entry of a node outside the cluster: `gpu0 pve2: keep 0000:21:00 group 9
    (10de:2bb1), not a node of this inventory's cluster`."""
    return [
        f"{change.id} {node}: keep {_where(entry)}, not a node of this inventory's cluster"
        for node, entry in sorted(_entries(change.kept).items())
    ]


def _where(entry: MapEntry) -> str:
    return f"{entry.path} group {entry.iommugroup} ({entry.id})"


def _entries(texts: Sequence[str]) -> dict[str, MapEntry]:
    parsed = (_parsed(text) for text in texts)
    return {entry.node: entry for entry in parsed if entry is not None}


def _parsed(text: str) -> MapEntry | None:
    try:
        return parse_map_entry(text)
    except MapEntryError:
        return None


def _errors(state: MappingState) -> list[str]:
    return [c.message.strip() for c in state.checks or () if c.severity is Severity.ERROR]


def _log_checks(state: MappingState, node: str, prefix: str) -> None:
    if managed_index(prefix, state.mapping.id) is None:
        return
    for check in state.checks or ():
        logger.info(
            f"{host.print_prefix}Proxmox check of {state.mapping.id} on {node}: {check.message.strip()}"
        )


def _create(api: PveClient, mapping: PciMapping) -> None:
    endpoint = "POST /cluster/mapping/pci"
    failure = attempt(lambda: api.create_mapping(mapping))
    now = _read_back(api, mapping, failure, endpoint, "created")
    if now is not None and now.mapping.map == mapping.map and _marked(now, mapping):
        _accepted(mapping.id, failure)
        return
    said = what_came_back(failure, endpoint)
    if now is None:
        found = "" if failure else f", but GET /cluster/mapping/pci/{mapping.id} finds no such mapping"
        raise OperationError(f"mapping {mapping.id} not created: {said}{found}")
    raise OperationError(_not_ours(mapping, now, said))


def _update(api: PveClient, mapping: PciMapping, seen: tuple[str, ...]) -> None:
    try:
        now = api.mapping(mapping.id)
    except PveError as error:
        raise OperationError(f"mapping {mapping.id} not updated: {error.line}; nothing written") from None
    if now is None or now.mapping.map != seen:
        held = "gone" if now is None else f"now {list(now.mapping.map)}"
        raise OperationError(
            f"mapping {mapping.id} changed since pvegpu read it ({held}): not overwritten; run again"
        )
    endpoint = f"PUT /cluster/mapping/pci/{mapping.id}"
    failure = attempt(lambda: api.update_mapping(mapping, now.digest))
    after = _read_back(api, mapping, failure, endpoint, "updated")
    if after is not None and after.mapping.map == mapping.map and _marked(after, mapping):
        _accepted(mapping.id, failure)
        return
    said = what_came_back(failure, endpoint)
    if after is not None and after.digest == now.digest:
        unchanged = "" if failure else ", but reading it back shows it unchanged"
        raise OperationError(f"mapping {mapping.id} not updated, nothing overwritten: {said}{unchanged}")
    raise OperationError(_not_ours(mapping, after, said))


def _marked(state: MappingState, mapping: PciMapping) -> bool:
    """Whether `state` holds the description pvegpu sent (any, when it sent none)."""
    return mapping.description is None or state.mapping.description == mapping.description


def _read_back(
    api: PveClient, mapping: PciMapping, failure: PveError | None, endpoint: str, done: str
) -> MappingState | None:
    """The mapping as Proxmox holds it after a write; a failed read says the outcome is unknown."""
    try:
        return api.mapping(mapping.id)
    except PveError as error:
        raise OperationError(
            f"mapping {mapping.id}: {what_came_back(failure, endpoint)}; reading it back failed: "
            f"{error.line}; whether it was {done} is unknown, nothing more written; run again"
        ) from None


def _accepted(mapping_id: str, failure: PveError | None) -> None:
    if failure is not None:
        logger.warning(
            f"{host.print_prefix}mapping {mapping_id}: {failure.line}; reading it back shows it as planned"
        )


def _not_ours(mapping: PciMapping, now: MappingState | None, said: str) -> str:
    held = "is gone" if now is None else f"holds {list(now.mapping.map)}"
    return (
        f"mapping {mapping.id} {held} after {said}: not what pvegpu sent ({list(mapping.map)}); "
        "nothing more written; run again"
    )
