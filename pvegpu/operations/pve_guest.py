"""A Proxmox guest, the Q35 VM (`VM`) or the `lxc` profile's container (`CT`), through the API: the steps
both share, written once and told apart by a `GuestKind` (which API calls, which noun in messages).

- `Guest.config_or_none`: the config with its digest, None when the guest does not exist;
- `converge`: create the guest (every key, the task waited for) when it does not exist, else PUT only the
  keys that differ with the digest of the read they were diffed against: a concurrent edit fails with
  Proxmox's error (`checksum mismatch` for a VM, `detected modified configuration` for a container) and
  nothing is written. An existing guest (with its disks) is never recreated, but for the leftovers of
  pvegpu's own create that died (locked `create`, or never completely created; see `_dead_create`). Every
  write is read back and diffed again: what is said (created, updated, `nothing overwritten`) is what
  reading back shows, whatever the write answered (an error after Proxmox wrote, success from an endpoint
  that wrote nothing);
- `guest_running`: started, the task waited for, then until the guest reports running;
- `guest_parked`: for a profile that does not use it, `onboot: 0` and shut down (stopped only when the
  shutdown timed out, said so), so the next profile gets the GPUs; never deleted.

Ownership (pvegpu/plan/ownership.py): with an `Ownership`, a guest is created with pvegpu's mark (tag
`pvegpu`, `pvegpu-owner: <owner>` in its description), and an existing one is converged, parked or stopped
only when it carries it. One without it is refused with one line naming it and the adopt switch
(`refuse_foreign`, which roles call while preparing, so nothing is changed before it), or, adopted, gets
the mark in the same PUT as its other keys. A guest not pvegpu's is never parked: left alone, said so.

Reads happen while preparing; writes are `api_command`s run while executing, so `--dry` shows the
change (logged) without making it. Every API error names the endpoint and what came back (`PveError.line`).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.local.create_records import CreateLedger, CreateRecordError
from pvegpu.models.pve import GuestConfig, StorageVolume, TaskStatus
from pvegpu.models.pve_api import ROOT_PATH_WAY_OUT
from pvegpu.models.pve_root_only import ROOT_USER, root_only_params
from pvegpu.operations.api_command import api_command, attempt, one_line_errors, what_came_back
from pvegpu.operations.start_failure import start_failure
from pvegpu.plan.create_proof import (
    CreateRecord,
    backup_jobs_of,
    carries_nonce,
    create_storages,
    create_volumes,
    held_by,
    newest_task,
    ownership,
    utc,
    with_nonce,
    without_nonce,
)
from pvegpu.plan.guest_leftovers import left_by_a_create, unfinished
from pvegpu.plan.ownership import guest_mark, guest_mark_keys, refusal
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveConnectionError, PveError, PveResponseError, TaskFailedError
from pvegpu.pve.transport import Params
from pvegpu.run.wait import WaitTimeoutError, wait_until


@dataclass(frozen=True)
class GuestKind:
    """What tells a VM from a container in the steps they share: the noun Proxmox and pvegpu name it with
    in messages (`VM 100`, `CT 200`), the word for it in sentences about who holds the GPUs, its API path
    segment (`qemu`, `lxc`), the type of its HA resource id (`vm`, `ct`: `vm:100`), the node's command for
    it (`qm`, `pct`), its create task's type (`qmcreate`, `vzcreate`), and its API calls (PveClient
    methods, unbound). `unlock` and `destroy` are None for a container: Proxmox's API cannot remove a
    container's lock (its config PUT has no `skiplock`), and pvegpu does not destroy containers."""

    noun: str
    holder: str
    path: str
    ha_type: str
    cli: str
    create_task: str
    config: Callable[[PveClient, str, int], GuestConfig]
    create: Callable[[PveClient, str, int, Params], str]
    update: Callable[[PveClient, str, int, Params, str, Sequence[str]], None]
    start: Callable[[PveClient, str, int], str]
    stop: Callable[[PveClient, str, int], str]
    shutdown: Callable[[PveClient, str, int, int], str] | None
    status: Callable[[PveClient, str, int], str]
    unlock: Callable[[PveClient, str, int, str], None] | None
    destroy: Callable[[PveClient, str, int], str] | None


def _vm_status(api: PveClient, node: str, vmid: int) -> str:
    return api.vm_status(node, vmid).status


VM = GuestKind(
    noun="VM",
    holder="VM",
    path="qemu",
    ha_type="vm",
    cli="qm",
    create_task="qmcreate",
    config=PveClient.vm_config,
    create=PveClient.create_vm,
    update=PveClient.update_vm_config,
    start=PveClient.start_vm,
    stop=PveClient.stop_vm,
    shutdown=PveClient.shutdown_vm,
    status=_vm_status,
    unlock=PveClient.unlock_vm,
    destroy=PveClient.destroy_vm,
)
CT = GuestKind(
    noun="CT",
    holder="container",
    path="lxc",
    ha_type="ct",
    cli="pct",
    create_task="vzcreate",
    config=PveClient.lxc_config,
    create=PveClient.create_lxc,
    update=PveClient.update_lxc_config,
    start=PveClient.start_lxc,
    stop=PveClient.stop_lxc,
    shutdown=PveClient.shutdown_lxc,
    status=PveClient.lxc_status,
    unlock=None,
    destroy=None,
)


@dataclass(frozen=True)
class Guest:
    """One guest: guest `vmid` of `kind` on `node`, reached through `api`."""

    kind: GuestKind
    api: PveClient
    node: str
    vmid: int

    @property
    def label(self) -> str:
        """How messages name it: `VM 100`, `CT 200`."""
        return f"{self.kind.noun} {self.vmid}"

    def config_or_none(self) -> GuestConfig | None:
        """Its config, None when Proxmox says its config file does not exist."""
        try:
            return self.kind.config(self.api, self.node, self.vmid)
        except PveError as error:
            if error.message.startswith("Configuration file ") and error.message.endswith("does not exist"):
                return None
            raise

    def status(self) -> str:
        """`running` or `stopped`."""
        return self.kind.status(self.api, self.node, self.vmid)

    @property
    def config_endpoint(self) -> str:
        return f"/nodes/{self.node}/{self.kind.path}/{self.vmid}/config"

    def read_config(self, *, refuse_locked: bool = True) -> GuestConfig | None:
        """`config_or_none` while preparing: a failed read is an OperationError naming the endpoint, and
        with `refuse_locked` a locked guest (`lock:` in its config) is refused with `locked`."""
        try:
            config = self.config_or_none()
        except PveError as error:
            raise OperationError(f"{self.label} not read: {error.line}; nothing written") from None
        if refuse_locked and config is not None and "lock" in config.values:
            raise OperationError(locked(self, str(config.values["lock"])))
        return config

    def read_status(self) -> str:
        """`status` while preparing: a failed read is an OperationError naming the endpoint."""
        try:
            return self.status()
        except PveError as error:
            raise OperationError(f"{self.label} not read: {error.line}; nothing written") from None


def locked(guest: Guest, lock: str, dead: str | None = None) -> str:
    """Why pvegpu leaves a guest with `lock: <lock>` alone, with the task that holds the lock (the guest's
    newest task) and the exact command that removes it. The only lock pvegpu removes itself is that of its
    own dead create (`converge`, `_dead_create`); `dead`: what to do instead when the task that holds it no
    longer runs (the next run repairs it by itself)."""
    try:
        tasks: tuple[TaskStatus, ...] | PveError = guest.api.guest_tasks(guest.node, guest.vmid)
    except PveError as error:
        tasks = error
    return _locked_by(guest, lock, tasks, dead)


def _locked_by(
    guest: Guest, lock: str, tasks: tuple[TaskStatus, ...] | PveError, dead: str | None = None
) -> str:
    """`locked`'s sentence, given the guest's tasks (newest first) or why they could not be listed."""
    unlock = f"`{guest.kind.cli} unlock {guest.vmid}`"
    check = f"check {guest.label} on {guest.node}, remove the lock with {unlock} there, then run again"
    if isinstance(tasks, PveError):
        return f"{guest.label} is locked ({lock}); its tasks could not be listed ({tasks.line}): {check}"
    if not tasks:
        return f"{guest.label} is locked ({lock}) and Proxmox lists no task of it: {check}"
    task = tasks[0]
    if task.status == "running":
        return (
            f"{guest.label} is locked ({lock}) by task {task.upid}, which still runs: "
            "run again when it has ended"
        )
    return (
        f"{guest.label} is locked ({lock}); its last task {task.upid} no longer runs "
        f"(exit status: {task.exitstatus}): {dead or check}"
    )


@dataclass(frozen=True)
class Ownership:
    """Whose guest pvegpu may touch: `owner` is the id in pvegpu's mark (plan/ownership.py `owner_id`),
    `adopt` the inventory's switch to take over a guest without the mark, `switch` its name (`vm.adopt`)."""

    owner: str
    adopt: bool
    switch: str


def mark_to_write(guest: Guest, values: Mapping[str, object], ownership: Ownership) -> dict[str, str]:
    """The keys that mark existing guest `values` as pvegpu's: empty when it is; with `adopt`, the mark's
    `tags` / `description` (the operator's own kept); else OperationError, the one-line refusal."""
    mark = guest_mark(values, ownership.owner)
    if mark.ours:
        return {}
    if not ownership.adopt:
        raise OperationError(refusal(guest.label, guest.node, mark, ownership.switch))
    return guest_mark_keys(values, ownership.owner)


def refuse_foreign(guest: Guest, ownership: Ownership) -> None:
    """While preparing (before any operation of the run changes anything): OperationError with the one-line
    refusal when a guest exists at `guest.vmid` without pvegpu's mark and the inventory does not adopt it.
    An absent guest, and the leftover of a create that died (`converge` judges it), pass."""
    config = guest.read_config(refuse_locked=False)
    if config is not None and not left_by_a_create(config.values):
        mark_to_write(guest, config.values, ownership)


@dataclass(frozen=True)
class MarkedChange:
    """A config change with the keys of pvegpu's mark added."""

    set: dict[str, str]
    delete: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete)


def with_mark(diff: Diff, ownership: Ownership) -> Diff:
    """`diff`, plus the mark's keys wherever the config lacks them (so reading back checks them too)."""

    def marked(values: Mapping[str, object]) -> ConfigChange:
        change = diff(values)
        keys = guest_mark_keys(values, ownership.owner)
        return change if not keys else MarkedChange({**change.set, **keys}, change.delete)

    return marked


class ConfigChange(Protocol):
    """Keys to set and keys to delete (plan/vm.py's VmChange, plan/lxc.py's ContainerChange)."""

    @property
    def set(self) -> dict[str, str]: ...
    @property
    def delete(self) -> tuple[str, ...]: ...
    @property
    def changed(self) -> bool: ...


@one_line_errors
def converge(
    guest: Guest,
    *,
    create: Mapping[str, str],
    diff: Callable[[Mapping[str, object]], ConfigChange],
    unchanged: str,
    timeout_s: float,
    ledger: CreateLedger | None = None,
    ownership: Ownership | None = None,
) -> Generator[FunctionCommand, None, None]:
    """Yield what makes `guest` hold its config: when absent, its creation with `create` (every key); else
    the PUT of `diff(current values)` with the read's digest, each change logged. Noop with the sentence
    `unchanged` when nothing differs. `diff` may raise OperationError (a refusal).

    `ledger` keeps pvegpu's record of each create it sends (pvegpu/local/create_records.py; None: no records).
    A guest locked `create`, or never completely created, is what a create left: when its create task has
    ended and the record proves it pvegpu's, a warning names the task and the guest is unlocked, destroyed
    and created again in this run; else it is reported with its task and the exact command (`locked`,
    `_half_made`), untouched. Any other lock is reported (`locked`).

    With `ownership`, pvegpu's mark is part of the config: created with it, and an existing guest without
    it refused (`mark_to_write`) unless adopted, then marked in the same PUT."""
    current = guest.read_config(refuse_locked=False)
    if ownership is not None:
        create = {**create, **guest_mark_keys({}, ownership.owner)}
        diff = with_mark(diff, ownership)
    if current is None:
        shown = " ".join(f"{key}={create[key]}" for key in sorted(create))
        logger.info(f"{host.print_prefix}{guest.label}: create {shown}")
        yield api_command(_create, guest, create, diff, timeout_s, ledger)
        return
    lock = current.values.get("lock")
    if left_by_a_create(current.values):
        marks = unfinished(current.values)
        warning, upid, record = _dead_create(guest, current, marks, ledger)
        logger.warning(f"{host.print_prefix}{warning}")
        remade = partial(_create, guest, create, diff, timeout_s, ledger)
        dead = DeadCreate(current, upid, record, create_storages(create))
        yield api_command(_remake, guest, dead, timeout_s, remade)
        return
    if ownership is not None:
        adopting = mark_to_write(guest, current.values, ownership)
        if adopting:
            logger.info(
                f"{host.print_prefix}{guest.label}: adopted ({ownership.switch}): writing pvegpu's mark"
            )
    if lock is not None:
        raise OperationError(locked(guest, str(lock)))
    _forget(guest, ledger)  # whole: a record left by a create whose reading back failed proves nothing now
    change = diff(current.values)
    if not change.changed:
        host.noop(unchanged)
        return
    refused = root_only_refusal(guest, change)
    if refused is not None:
        raise OperationError(refused)
    for key, value in sorted(change.set.items()):
        logger.info(f"{host.print_prefix}{guest.label} {key}: {current.values.get(key)} -> {value}")
    for key in change.delete:
        logger.info(f"{host.print_prefix}{guest.label} {key}: delete")
    yield api_command(_update, guest, change, current, diff)


Diff = Callable[[Mapping[str, object]], ConfigChange]


def root_only_refusal(guest: Guest, change: ConfigChange) -> str | None:
    """One line when `change` carries a key only root@pam may write and pvegpu acts as a token (no root path):
    the inventory refuses the features that set such keys, but a key root wrote in an earlier run is still
    deleted or rewritten by the PUT, which Proxmox would refuse half-way through the run. None otherwise."""
    params: Params = {**change.set, "delete": ",".join(change.delete) or None}
    keys = root_only_params("PUT", guest.config_endpoint, params)
    who = guest.api.acts_as("PUT", guest.config_endpoint, params)
    if not keys or who == ROOT_USER:
        return None
    deleted = [key for key in keys if key in change.delete]
    written = [key for key in keys if key not in change.delete]
    verbs = [
        f"{verb} {', '.join(repr(key) for key in some)}"
        for verb, some in (("set", written), ("delete", deleted))
        if some
    ]
    way_out = ROOT_PATH_WAY_OUT
    if deleted and not written:  # what root wrote earlier, root may remove by hand
        removal = f"{guest.kind.cli} set {guest.vmid} --delete {','.join(deleted)}"
        way_out = f"remove it as root on {guest.node} (`{removal}`), or {way_out}"
    return (
        f"{guest.label}: the API token {who} cannot {' or '.join(verbs)} (Proxmox allows it to root@pam "
        f"only): {way_out}"
    )


def _dead_create(
    guest: Guest, current: GuestConfig, marks: Sequence[str], ledger: CreateLedger | None
) -> tuple[str, str, CreateRecord]:
    """The warning for the leftovers of pvegpu's own dead create of `guest` (locked `create`, or `marks` of
    an unfinished create), which `_remake` replaces, the UPID of that create (the guest's newest task,
    checked again before the unlock) and pvegpu's record of it; OperationError with today's report
    (`locked`, `_half_made`) when its create task still runs, is not the newest task, is not provably
    pvegpu's (pvegpu/plan/create_proof.py: the record, the whole task list, the nonce; the reason logged),
    or pvegpu may not remove it; OperationError with `_refuse_held`'s line when HA or a replication job
    holds it."""
    lock = current.values.get("lock")
    try:
        tasks: tuple[TaskStatus, ...] | PveError = guest.api.guest_tasks(guest.node, guest.vmid)
    except PveError as error:
        tasks = error
    report = _locked_by(guest, str(lock), tasks) if lock is not None else _half_made(guest, marks)
    if (
        lock not in (None, "create")
        or isinstance(tasks, PveError)
        or not tasks
        or tasks[0].status == "running"
    ):
        raise OperationError(report)
    task = tasks[0]
    try:
        record = None if ledger is None else ledger.read(guest.node, guest.kind.path, guest.vmid)
    except CreateRecordError as error:
        raise OperationError(f"{guest.label}: {error}") from None
    user = "" if ledger is None else ledger.api_user
    if record is None:
        proof = ownership(record, task.upid, guest.kind.create_task, guest.vmid, user)
    else:
        newest = _newest_of_all(guest, tasks)
        if isinstance(newest, str):
            logger.info(
                f"{host.print_prefix}{guest.label}: the dead create is not provably pvegpu's: {newest}"
            )
            raise OperationError(report)
        task = newest
        proof = ownership(record, task.upid, guest.kind.create_task, guest.vmid, user)
        nonce = carries_nonce(current.values, record) if proof.own else None
        if nonce is not None:
            proof = nonce if not nonce.own else replace(proof, why=f"{proof.why}; {nonce.why}")
    config = f"/nodes/{guest.node}/{guest.kind.path}/{guest.vmid}/config"
    unlocker = guest.api.acts_as("PUT", config, {"delete": "lock", "skiplock": True})
    refusal = None if proof.own else f"not provably pvegpu's: {proof.why}"
    if refusal is None and guest.kind.destroy is None:
        refusal = f"pvegpu's ({proof.why}), but pvegpu does not destroy a {guest.kind.holder}"
    elif refusal is None and lock is not None and unlocker != ROOT_USER:
        refusal = (
            f"pvegpu's ({proof.why}), but only {ROOT_USER} may remove a lock through the API "
            f"and pvegpu acts as {unlocker}"
        )
    if refusal is not None or record is None:
        logger.info(f"{host.print_prefix}{guest.label}: the dead create {task.upid} is {refusal}")
        raise OperationError(report)
    _refuse_held(guest)
    ended = f"which no longer runs (exit status: {task.exitstatus}; {proof.why})"
    if lock is not None:
        warning = (
            f"{guest.label} is locked (create) by pvegpu's create task {task.upid}, {ended}: removing the "
            "lock, destroying what it left and creating it again"
        )
        return warning, task.upid, record
    warning = (
        f"{guest.label} on {guest.node} was never completely created ({'; '.join(marks)}) by pvegpu's "
        f"create task {task.upid}, {ended}: destroying what it left and creating it again"
    )
    return warning, task.upid, record


def _newest_of_all(guest: Guest, tasks: Sequence[TaskStatus]) -> TaskStatus | str:
    """The guest's newest task by start time when `tasks` is all of them (the identity holds Sys.Audit on
    the node: pve-manager API2/Tasks.pm lists only one's own tasks without it) and none runs; else why
    not (`newest_task`)."""
    where = f"/nodes/{guest.node}"
    try:
        sees_all = "Sys.Audit" in guest.api.permissions(where)
    except PveError as error:
        return f"whether the task list is the whole of {where}'s is unknown ({error.line})"
    return newest_task(tasks, sees_all, where)


@dataclass(frozen=True)
class DeadCreate:
    """pvegpu's own dead create as judged while preparing: the `leftover` config, its task `upid`, pvegpu's
    `record` of it and the `storages` its disk keys allocate on (plan/create_proof.py create_storages)."""

    leftover: GuestConfig
    upid: str
    record: CreateRecord
    storages: tuple[str, ...]


def _remake(guest: Guest, dead: DeadCreate, timeout_s: float, create: Callable[[], None]) -> None:
    """Unlock (with the digest of the read that judged it) and destroy what pvegpu's dead create left,
    waiting for the destroy task, free the volumes that create allocated and the destroy did not (its
    config never named them), then `create` it (`_create`). Right before, the guest is judged again: its
    config digest and its newest task must still be the leftover's and `dead.upid` (else a one-line refusal,
    nothing unlocked or destroyed).

    The destroy sends no `purge` and no `destroy-unreferenced-disks` (PveClient.destroy_vm): only volumes of
    the create's storages owned by `vmid` and created since the record's `sent` are freed; an older one is
    left and named in one warning. An HA resource or a replication job that holds the guest, which Proxmox
    refuses a destroy without `purge` for, is read again before the unlock and refused in one line naming it
    (`_refuse_held`), nothing unlocked or destroyed; Proxmox's own refusal, should one be added in between,
    is one line alike (`_held_by`). Nothing of those entries is edited. The backup jobs that include `vmid`
    are read before the unlock too and named in one warning once it is destroyed (`_backups_named`)."""
    unlock, destroy = guest.kind.unlock, guest.kind.destroy
    assert destroy is not None  # _dead_create refuses a kind without
    leftover = dead.leftover
    _still_judged(guest, leftover, dead.upid)
    _refuse_held(guest)
    backups = _backups_named(guest)
    found = create_volumes(
        _volumes(guest, dead.storages, "nothing unlocked or destroyed"), guest.vmid, dead.record
    )
    if found.older:
        logger.warning(
            f"{host.print_prefix}{guest.label}: left {', '.join(found.older)}: older than pvegpu's create "
            f"(sent {utc(dead.record.sent)}), not provably its own"
        )
    if "lock" in leftover.values:
        assert unlock is not None
        failure = attempt(lambda: unlock(guest.api, guest.node, guest.vmid, leftover.digest))
        if failure is not None:
            raise OperationError(f"{guest.label} not unlocked: {failure.line}; nothing destroyed")
    endpoint = f"DELETE /nodes/{guest.node}/{guest.kind.path}/{guest.vmid}"
    failure = attempt(lambda: guest.api.wait_task(destroy(guest.api, guest.node, guest.vmid), timeout_s))
    said = what_came_back(failure, endpoint)
    held = None if failure is None else _held_by(failure.message)
    if held is not None:
        unlocked = "its create lock removed, " if "lock" in leftover.values else ""
        raise OperationError(
            f"{guest.label} on {guest.node} not destroyed, {held}: {said.rstrip('.')}; pvegpu purges no HA "
            f"or replication entry ({unlocked}nothing destroyed): remove it from there, then run again"
        )
    if _read_back(guest, said, "destroyed") is not None:
        raise OperationError(f"{guest.label} not destroyed: {said}; not created again, run again")
    if backups is not None:
        logger.warning(f"{host.print_prefix}{backups}")
    _freed(guest, found.ours)
    create()


def _refuse_held(guest: Guest) -> None:
    """OperationError, one line naming the guest and what holds it, when it is an HA resource or a
    replication job replicates it (plan/create_proof.py `held_by`), or when that cannot be read (the HA
    resources need Sys.Audit on `/`): Proxmox refuses to destroy it without `purge`, which pvegpu never
    sends, so nothing is unlocked or destroyed."""
    untouched = "nothing unlocked or destroyed"
    try:
        sids, jobs = guest.api.ha_resources(), guest.api.replication_jobs()
    except PveError as error:
        raise OperationError(
            f"{guest.label} on {guest.node} not destroyed: whether HA or a replication job holds it is "
            f"unknown ({error.line}); {untouched}, run again"
        ) from None
    held = held_by(sids, jobs, f"{guest.kind.ha_type}:{guest.vmid}", guest.vmid)
    if held is not None:
        raise OperationError(
            f"{guest.label} on {guest.node} not destroyed, {held}; pvegpu purges no HA or replication entry "
            f"({untouched}): remove it from there, then run again"
        )


def _backups_named(guest: Guest) -> str | None:
    """The warning naming the backup jobs that include the guest (plan/create_proof.py `backup_jobs_of`),
    which its destroy leaves as they are (no `purge`), or saying they could not be read; None for none."""
    try:
        jobs = guest.api.backup_jobs()
    except PveError as error:
        return (
            f"{guest.label}: the backup jobs that may include it not read ({error.line}); pvegpu edits none"
        )
    found = backup_jobs_of(jobs, guest.vmid, guest.node)
    if not found:
        return None
    one = len(found) == 1
    named = f"job {found[0]} still includes" if one else f"jobs {', '.join(found)} still include"
    backs = "it backs" if one else "they back"
    return (
        f"{guest.label} destroyed, but backup {named} vmid {guest.vmid}: pvegpu edits no backup job (no "
        f"purge), so {backs} up the {guest.kind.holder} created again"
    )


def _held_by(message: str) -> str | None:
    """What holds a VM that Proxmox refused to destroy without `purge` (API2/Qemu.pm destroy_vm's early
    checks, pve-guest-common ReplicationConfig.pm check_for_existing_jobs), None for another error."""
    if "used in HA resources and purge parameter not set" in message:
        return "it is an HA resource"
    job = re.search(r"There is a replication job '([^']+)' for guest", message)
    return None if job is None else f"replication job {job[1]} replicates it"


def _volumes(guest: Guest, storages: Sequence[str], untouched: str) -> tuple[StorageVolume, ...]:
    """Guest `vmid`'s volumes on `storages`; a failed listing is one line ending `untouched`."""
    found: list[StorageVolume] = []
    for storage in storages:
        try:
            found.extend(guest.api.guest_volumes(guest.node, storage, guest.vmid))
        except PveError as error:
            raise OperationError(
                f"{guest.label}: its volumes on {storage} not listed: {error.line}; {untouched}"
            ) from None
    return tuple(found)


def _freed(guest: Guest, ours: Sequence[str]) -> None:
    """Delete the volumes of `ours` (volids) still there after the destroy, each task waited for; a failure
    is one line naming the volume (the guest is gone: the next run creates it anew)."""
    if not ours:
        return
    storages = tuple(sorted({volid.split(":", 1)[0] for volid in ours}))
    untouched = "not created again, run again"
    still = {v.volid for v in _volumes(guest, storages, untouched)}
    for volid in [volid for volid in ours if volid in still]:
        storage = volid.split(":", 1)[0]
        try:
            guest.api.wait_task(guest.api.delete_volume(guest.node, storage, volid), 600)
        except PveError as error:
            raise OperationError(
                f"{guest.label} destroyed, but its create's volume {volid} not freed: {error.line}; "
                f"{untouched}"
            ) from None
        logger.info(f"{host.print_prefix}{guest.label}: freed {volid}, left by pvegpu's dead create")


def _still_judged(guest: Guest, leftover: GuestConfig, upid: str) -> None:
    """OperationError (one line, nothing unlocked or destroyed) unless the guest's config digest is still
    `leftover`'s and its newest task still `upid`, the create judged pvegpu's while preparing."""
    untouched = "nothing unlocked or destroyed; run again"
    try:
        now = guest.config_or_none()
        tasks = guest.api.guest_tasks(guest.node, guest.vmid)
    except PveError as error:
        raise OperationError(f"{guest.label} not judged again: {error.line}; {untouched}") from None
    if now is None or now.digest != leftover.digest:
        digest = "its config is gone" if now is None else f"digest {now.digest}"
        raise OperationError(
            f"{guest.label} changed since pvegpu judged it its own dead create (digest {leftover.digest}, "
            f"now {digest}): {untouched}"
        )
    newest = newest_task(tasks, True, f"/nodes/{guest.node}")
    if isinstance(newest, str) or newest.upid != upid:
        seen = newest if isinstance(newest, str) else f"its newest task is {newest.upid}"
        raise OperationError(
            f"{guest.label} has a task since pvegpu judged {upid} its own dead create ({seen}): {untouched}"
        )


def _create(
    guest: Guest, params: Mapping[str, str], diff: Diff, timeout_s: float, ledger: CreateLedger | None = None
) -> None:
    """POST the create with a nonce of this run on its own description line (`pvegpu-create: <nonce>`,
    kept in the record: what proves a leftover of it pvegpu's), wait for its task and verify the guest whole.
    A POST answered with an error started no task of pvegpu's (another's create, e.g. `VM 100 already
    exists on node 'pve1'`) unless the guest's newest task is one it may have started (`_may_be_ours`):
    else the record goes and what is there is not looked at. Only a POST that got no answer (a lost
    connection, a timeout) or not the API's keeps a record without its UPID."""
    endpoint = f"POST /nodes/{guest.node}/{guest.kind.path}"
    sent = int(time.time())
    nonce = new_nonce()
    sending = {**params, "description": with_nonce(params.get("description"), nonce)}
    answered: list[PveError] = []

    def post_and_wait() -> None:
        _record(guest, ledger, CreateRecord(upid=None, sent=sent, nonce=nonce))  # it may never answer
        try:
            upid = guest.kind.create(guest.api, guest.node, guest.vmid, sending)
        except (PveConnectionError, PveResponseError):
            raise  # no answer, or not the API's: whether a task started is unknown
        except PveError as error:
            answered.append(error)
            raise
        _record(guest, ledger, CreateRecord(upid=upid, sent=sent, nonce=nonce))
        guest.api.wait_task(upid, timeout_s)

    failure = attempt(post_and_wait)
    said = what_came_back(failure, endpoint)
    if answered and not _may_be_ours(guest, sent, sending):
        _forget(guest, ledger)
        raise OperationError(f"{guest.label} not created: {said}")
    after = _read_back(guest, said, "created")
    if after is None:
        _forget(guest, ledger)  # nothing was made: nothing left to prove
        found = "" if failure else f", but GET {guest.config_endpoint} finds no config"
        raise OperationError(f"{guest.label} not created: {said}{found}")
    if "lock" in after.values:
        # pvegpu's record of this create (kept) proves the leftover its own to the next run, which removes it.
        again = "nothing after it was written; run again (it destroys what the create left and creates it)"
        lock = locked(guest, str(after.values["lock"]), again if ledger is not None else None)
        raise OperationError(f"{guest.label} not completely created after {said}: {lock}")
    marks = unfinished(after.values)
    if marks:
        raise OperationError(f"{_half_made(guest, marks)} (after {said})")
    _forget(guest, ledger)  # whole
    after = _nonce_removed(guest, after, said)
    left = diff(after.values)
    if left.changed:
        raise OperationError(
            f"{guest.label} created, but {_differences(left, after)} after {said}; run again"
        )
    _accepted(guest, failure)


def _may_be_ours(guest: Guest, sent: int, params: Params) -> bool:
    """Whether the guest's newest task is a create this POST (sent at `sent`) may have started: pvesh runs
    the task inside the call, so an error it exits with may come after the task began (a worker killed).
    Not when the tasks cannot be listed: an answered error then drops the record."""
    try:
        tasks = guest.api.guest_tasks(guest.node, guest.vmid)
    except PveError:
        return False
    newest = newest_task(tasks, True, f"/nodes/{guest.node}")
    if isinstance(newest, str):
        return False
    user = guest.api.acts_as("POST", f"/nodes/{guest.node}/{guest.kind.path}", params)
    return ownership(CreateRecord(None, sent), newest.upid, guest.kind.create_task, guest.vmid, user).own


def new_nonce() -> str:
    """A create's nonce: 128 random bits of this machine, 32 hex digits."""
    return secrets.token_hex(16)


def _nonce_removed(guest: Guest, after: GuestConfig, said: str) -> GuestConfig:
    """The whole guest's config once its `pvegpu-create:` description line is gone (PUT with `after`'s
    digest: the nonce proved the create's leftovers, a whole guest needs none), its other lines kept."""
    values = without_nonce(after.values)
    if values == after.values:
        return after
    description = values.get("description")
    put: Params = {} if description is None else {"description": str(description)}
    gone = () if description is not None else ("description",)
    failure = attempt(lambda: guest.kind.update(guest.api, guest.node, guest.vmid, put, after.digest, gone))
    put_said = what_came_back(failure, f"PUT {guest.config_endpoint}")
    again = _read_back(guest, f"{said}, then {put_said}", "updated")
    if again is None or without_nonce(again.values) != again.values:
        raise OperationError(
            f"{guest.label} created, but its `pvegpu-create:` description line not removed: {put_said}; "
            "run again"
        )
    return again


def _update(guest: Guest, change: ConfigChange, before: GuestConfig, diff: Diff) -> None:
    endpoint = f"PUT {guest.config_endpoint}"
    failure = attempt(
        lambda: guest.kind.update(guest.api, guest.node, guest.vmid, change.set, before.digest, change.delete)
    )
    said = what_came_back(failure, endpoint)
    after = _read_back(guest, said, "updated")
    if after is None:
        raise OperationError(f"{guest.label} is gone after {said}")
    left = diff(after.values)
    if not left.changed:
        _accepted(guest, failure)
        return
    if all(after.values.get(key) == before.values.get(key) for key in (*change.set, *change.delete)):
        unchanged = "" if failure else ", but reading it back shows those keys unchanged"
        raise OperationError(f"{guest.label} config not updated, nothing overwritten: {said}{unchanged}")
    raise OperationError(f"{guest.label}: {_differences(left, after)} after {said}; run again")


def _record(guest: Guest, ledger: CreateLedger | None, record: CreateRecord) -> None:
    if ledger is None:
        return
    try:
        ledger.write(guest.node, guest.kind.path, guest.vmid, record)
    except OSError as error:
        sent = "not sent" if record.upid is None else f"sent (task {record.upid})"
        raise OperationError(
            f"{guest.label}: pvegpu's record of its create not written ({error}); create {sent}"
        ) from None


def _forget(guest: Guest, ledger: CreateLedger | None) -> None:
    if ledger is None:
        return
    try:
        ledger.forget(guest.node, guest.kind.path, guest.vmid)
    except CreateRecordError as error:
        raise OperationError(f"{guest.label}: {error}") from None


def _half_made(guest: Guest, marks: Sequence[str]) -> str:
    return (
        f"{guest.label} on {guest.node} was never completely created: {'; '.join(marks)}: pvegpu does not "
        f"take it over; remove it (`{guest.kind.cli} destroy {guest.vmid}`) or finish it by hand, then run "
        "again"
    )


def _read_back(guest: Guest, said: str, done: str) -> GuestConfig | None:
    try:
        return guest.config_or_none()
    except PveError as error:
        raise OperationError(
            f"{guest.label}: {said}; reading it back failed: {error.line}; whether it was {done} is "
            "unknown, nothing more written; run again"
        ) from None


def _accepted(guest: Guest, failure: PveError | None) -> None:
    if failure is not None:
        logger.warning(
            f"{host.print_prefix}{guest.label}: {failure.line}; reading it back shows the config as planned"
        )


def _differences(left: ConfigChange, after: GuestConfig) -> str:
    """`its config still differs: cores 8 (sent 16), hugepages 2 (sent: delete)`."""
    keys = [f"{key} {after.values.get(key)} (sent {value})" for key, value in sorted(left.set.items())]
    keys += [f"{key} {after.values.get(key)} (sent: delete)" for key in left.delete]
    return f"its config still differs: {', '.join(keys)}"


@operation(is_idempotent=True)
@one_line_errors
def guest_running(
    *,
    guest: Guest,
    timeout_s: float,
    unbound: Sequence[str] = (),
    recheck: Callable[[Host], Sequence[str]] | None = None,
    after_start: Callable[[], None] | None = None,
) -> Generator[FunctionCommand, None, None]:
    """Start `guest` unless it runs; wait for the start task (its failure carries Proxmox's message,
    e.g. `PCI device mapping invalid (hardware probably changed): ...`) and until it reports running.

    `unbound` lists the passed GPUs' functions not bound to vfio-pci on the node (a VM's): starting is
    refused while any is (deploy/host.py binds them). With `recheck` (host -> unbound functions, read again
    when the start executes), the refusal waits until then: an earlier operation of the same run (the host
    role's reboot, deploy/site.py) may bind them. `after_start` runs once this run has started the guest
    (e.g. waiting until a new VM's guest answers on SSH); its OperationError fails the host.
    """
    if guest.read_config() is not None and guest.read_status() == "running":
        host.noop(f"{guest.label} is running on {guest.node}")
        return
    if unbound and recheck is None:
        raise OperationError(_refusal(guest, unbound))
    logger.info(f"{host.print_prefix}{guest.label}: start on {guest.node}")
    if unbound and recheck is not None:
        check = recheck

        def start_when_bound() -> None:
            still = check(host)  # api_command runs this with pyinfra's `host` set to the node
            if still:
                raise OperationError(_refusal(guest, still))
            _start(guest, timeout_s, after_start)

        yield api_command(start_when_bound)
        return
    yield api_command(_start, guest, timeout_s, after_start)


def _refusal(guest: Guest, unbound: Sequence[str]) -> str:
    return (
        f"refusing to start {guest.label}: vfio binding not in effect on {guest.node} for "
        f"{', '.join(unbound)} (run deploy/host.py)"
    )


def _start(guest: Guest, timeout_s: float, after_start: Callable[[], None] | None = None) -> None:
    try:
        guest.api.wait_task(guest.kind.start(guest.api, guest.node, guest.vmid), timeout_s)
    except TaskFailedError as error:  # QEMU's own line where the task log has it
        raise OperationError(f"{guest.label} did not start: {start_failure(guest.api, error)}") from None
    except PveError as error:
        raise OperationError(f"{guest.label} not started: {error.line}") from None
    wait_status(guest, "running", timeout_s, "the start task ended OK, but it is not running")
    if after_start is not None:
        after_start()


def _stop(guest: Guest, timeout_s: float) -> None:
    try:
        guest.api.wait_task(guest.kind.stop(guest.api, guest.node, guest.vmid), timeout_s)
    except PveError as error:
        raise OperationError(f"{guest.label} not stopped: {error.line}") from None
    wait_status(guest, "stopped", timeout_s, "the stop task ended OK, but it runs")


def wait_status(guest: Guest, wanted: str, timeout_s: float, what: str) -> None:
    """Poll until the guest's status is `wanted`; else OperationError `<label>: <what> after N s`."""

    def pending() -> str | None:
        status = guest.status()
        return None if status == wanted else status

    try:
        wait_until(pending, timeout_s, f"{guest.label}: {what}")
    except WaitTimeoutError as timeout:
        raise OperationError(str(timeout)) from None
    except PveError as error:
        raise OperationError(f"{guest.label}: waiting until it is {wanted}: {error.line}") from None


def maps_gpus(values: Mapping[str, object], prefix: str) -> bool:
    """Whether a VM config has a `hostpciN` whose `mapping=` is one of pvegpu's (`<prefix>N`)."""
    mapping = re.compile(rf"(?:^|,)mapping={re.escape(prefix)}\d+(?:,|$)")
    return any(
        re.fullmatch(r"hostpci\d+", key) is not None and mapping.search(str(value)) is not None
        for key, value in values.items()
    )


@operation()
@one_line_errors
def guest_parked(
    *,
    guest: Guest,
    profile: str,
    allow_stop: bool,
    timeout_s: float,
    prefix: str | None = None,
    ownership: Ownership | None = None,
) -> Generator[FunctionCommand, None, None]:
    """For `profile`, which does not use `guest`: set `onboot: 0` (PUT with the read's digest), then
    shut it down and wait until it is stopped (`_park`: a VM is shut down cleanly, stopped only when the
    shutdown timed out, said so). It is never deleted: its disks are kept.

    With `ownership`, only a guest that carries pvegpu's mark is pvegpu's (plan/ownership.py); with its
    `adopt`, an unmarked one is marked in the same PUT as `onboot`. With `prefix` (and no `ownership`),
    only a VM whose config maps pvegpu's `<prefix>N` PCI mappings is. Any other is left alone. Noop when the
    guest does not exist, is not pvegpu's, or is stopped with `onboot: 0`. Stopping a running guest takes
    the GPUs away from it, as a reboot would: with `allow_stop` false (`pve_host.allow_reboot`) nothing is
    changed; a warning and the noop say what would be done.
    """
    config = guest.read_config(refuse_locked=False)  # a locked guest that is not pvegpu's is left alone
    if config is None:
        host.noop(f"{guest.label} does not exist on {guest.node}: no {guest.kind.holder} holds the GPUs")
        return
    mark_keys: dict[str, str] = {}
    if ownership is not None:
        mark = guest_mark(config.values, ownership.owner)
        if not mark.ours and not ownership.adopt:
            host.noop(
                f"{guest.label} on {guest.node} is not pvegpu's ({mark.found}): left alone, not stopped "
                f"({ownership.switch}: true lets pvegpu manage it)"
            )
            return
        mark_keys = guest_mark_keys(config.values, ownership.owner)
    elif prefix is not None and not maps_gpus(config.values, prefix):
        host.noop(
            f"{guest.label} on {guest.node} maps none of pvegpu's {prefix}N mappings: not pvegpu's, "
            "left alone"
        )
        return
    if "lock" in config.values:
        raise OperationError(locked(guest, str(config.values["lock"])))
    running = guest.read_status() == "running"
    onboot = str(config.values.get("onboot", "0")) == "1"
    if running and not allow_stop:
        message = (
            f"profile {profile}: {guest.label} is running on {guest.node} with the GPUs; would stop it and "
            "set onboot 0 (pve_host.allow_reboot is false: not stopping it)"
        )
        logger.warning(f"{host.print_prefix}{message}")
        host.noop(message)
        return
    if not running and not onboot and not mark_keys:
        host.noop(f"{guest.label} on {guest.node} is stopped and not started at boot (onboot 0)")
        return
    if onboot or mark_keys:
        if mark_keys and ownership is not None:
            logger.info(
                f"{host.print_prefix}{guest.label}: adopted ({ownership.switch}): writing pvegpu's mark"
            )
        if onboot:
            logger.info(f"{host.print_prefix}{guest.label}: onboot 1 -> 0 (profile {profile})")
        owner = None if not mark_keys or ownership is None else ownership.owner
        yield api_command(_no_onboot, guest, config.digest, config.values.get("onboot"), mark_keys, owner)
    if running:
        how = "shut down" if guest.kind.shutdown is not None else "stop"
        logger.info(f"{host.print_prefix}{guest.label}: {how} on {guest.node} (profile {profile})")
        yield api_command(_park, guest, timeout_s)


def _park(guest: Guest, timeout_s: float) -> None:
    """Shut the guest down cleanly, waiting up to `timeout_s` (Proxmox's shutdown `timeout`); only when that
    fails (the guest did not power off in time), a warning says so and it is stopped. A kind without a
    shutdown call (a container, through this client) is stopped."""
    shutdown = guest.kind.shutdown
    if shutdown is None:
        _stop(guest, timeout_s)
        return
    try:
        guest.api.wait_task(shutdown(guest.api, guest.node, guest.vmid, int(timeout_s)), timeout_s + 30)
    except PveError as error:
        logger.warning(
            f"{host.print_prefix}{guest.label} did not shut down within {int(timeout_s)} s ({error.line}): "
            "stopping it"
        )
        _stop(guest, timeout_s)
        return
    wait_status(guest, "stopped", timeout_s, "the shutdown task ended OK, but it runs")


def _no_onboot(
    guest: Guest, digest: str, onboot: object, mark: Mapping[str, str] | None = None, owner: str | None = None
) -> None:
    """PUT `onboot: 0` (and the keys of pvegpu's `mark` for `owner`, when adopting), read back."""
    keys: dict[str, str | int] = {"onboot": 0, **(mark or {})}
    failure = attempt(lambda: guest.kind.update(guest.api, guest.node, guest.vmid, keys, digest, ()))
    said = what_came_back(failure, f"PUT {guest.config_endpoint}")
    after = _read_back(guest, said, "updated")
    marked = owner is None or (after is not None and guest_mark(after.values, owner).ours)
    if after is not None and str(after.values.get("onboot", "0")) == "0" and marked:
        _accepted(guest, failure)
        return
    if after is not None and after.values.get("onboot") == onboot:
        unchanged = "" if failure else f", but reading it back shows onboot {onboot}"
        raise OperationError(f"{guest.label} onboot not cleared, nothing overwritten: {said}{unchanged}")
    held = "is gone" if after is None else f"has onboot {after.values.get('onboot')}"
    raise OperationError(f"{guest.label} {held} after {said}; run again")
