"""`pci_mappings`: the cluster's PCI mappings (`gpu0`...) made to match the GPUs of every node, via the API.

Read while the operation is prepared: `GET /cluster/mapping/pci?check-node=<node>` (Proxmox's own live check
of each mapping on this node). `diff_mappings` decides per pvegpu mapping: create (POST), update (PUT) or
unchanged; ids outside the `<prefix><N>` scheme are never touched. Each change is logged while preparing
(so `--dry` shows it: per GPU and node, old -> new address and IOMMU group) and carried out while
executing by a function command:

- create: `POST`; an id someone created meanwhile fails with Proxmox's `already defined` error;
- update: the mapping is read again, must still hold what was diffed (else: changed by someone else, not
  overwritten), and is PUT with the digest of that read. The digest covers the whole pci.cfg, so a
  concurrent edit anywhere in it fails the PUT with Proxmox's `detected modified configuration` error and
  nothing is written.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.models.pve import MapEntry, MapEntryError, MappingState, PciMapping, Severity, parse_map_entry
from pvegpu.plan.mapping import Action, MappingChange, diff_mappings, managed_index
from pvegpu.pve import PveClient, PveError


@operation()
def pci_mappings(
    *, api: PveClient, desired: Sequence[PciMapping], node: str, prefix: str
) -> Generator[FunctionCommand, None, None]:
    """Converge the mappings Proxmox holds to `desired` (from `plan_mappings`), checked on `node`."""
    states = api.mappings(check_node=node)
    for state in states:
        _log_checks(state, node, prefix)
    changes = diff_mappings(desired, [state.mapping for state in states], prefix)
    by_id = {mapping.id: mapping for mapping in desired}
    pending = [change for change in changes if change.action is not Action.UNCHANGED]
    # All of it is logged before the first command: change detection (--dry) stops at the first one.
    for change in pending:
        for line in describe(change):
            logger.info(f"{host.print_prefix}{line}")
    for change in pending:
        if change.action is Action.CREATE:
            yield FunctionCommand(_create, (api, by_id[change.id]), {})
        else:
            yield FunctionCommand(_update, (api, by_id[change.id], change.current), {})
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
    return lines or [f"{change.id}: rewrite {len(change.map)} map entries"]


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
    try:
        api.create_mapping(mapping)
    except PveError as error:
        raise OperationError(f"mapping {mapping.id} not created: {error.message}") from None


def _update(api: PveClient, mapping: PciMapping, seen: tuple[str, ...]) -> None:
    now = api.mapping(mapping.id)
    if now is None or now.mapping.map != seen:
        held = "gone" if now is None else f"now {list(now.mapping.map)}"
        raise OperationError(
            f"mapping {mapping.id} changed since pvegpu read it ({held}): not overwritten; run again"
        )
    try:
        api.update_mapping(mapping, now.digest)
    except PveError as error:
        raise OperationError(
            f"mapping {mapping.id} not updated, nothing overwritten: {error.message}"
        ) from None
