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
- `guest_parked`: for a profile that does not use it, `onboot: 0` and stopped, so the next profile gets
  the GPUs; never deleted.

Reads happen while preparing; writes are `api_command`s run while executing, so `--dry` shows the
change (logged) without making it. Every API error names the endpoint and what came back (`PveError.line`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.create_records import CreateLedger
from pvegpu.models.pve import GuestConfig, TaskStatus
from pvegpu.models.pve_root_only import ROOT_USER
from pvegpu.operations.api_command import api_command, attempt, one_line_errors, what_came_back
from pvegpu.operations.start_failure import start_failure
from pvegpu.plan.dead_create import CreateRecord, ownership
from pvegpu.plan.guest_leftovers import left_by_a_create, unfinished
from pvegpu.pve import Params, PveClient, PveError, TaskFailedError
from pvegpu.wait import WaitTimeoutError, wait_until


@dataclass(frozen=True)
class GuestKind:
    """What tells a VM from a container in the steps they share: the noun Proxmox and pvegpu name it with
    in messages (`VM 100`, `CT 200`), the word for it in sentences about who holds the GPUs, its API path
    segment (`qemu`, `lxc`), the node's command for it (`qm`, `pct`), its create task's type (`qmcreate`,
    `vzcreate`), and its API calls (PveClient methods, unbound). `unlock` and `destroy` are None for a
    container: Proxmox's API cannot remove a container's lock (its config PUT has no `skiplock`), and pvegpu
    does not destroy containers."""

    noun: str
    holder: str
    path: str
    cli: str
    create_task: str
    config: Callable[[PveClient, str, int], GuestConfig]
    create: Callable[[PveClient, str, int, Params], str]
    update: Callable[[PveClient, str, int, Params, str, Sequence[str]], None]
    start: Callable[[PveClient, str, int], str]
    stop: Callable[[PveClient, str, int], str]
    status: Callable[[PveClient, str, int], str]
    unlock: Callable[[PveClient, str, int, str], None] | None
    destroy: Callable[[PveClient, str, int], str] | None


def _vm_status(api: PveClient, node: str, vmid: int) -> str:
    return api.vm_status(node, vmid).status


VM = GuestKind(
    noun="VM",
    holder="VM",
    path="qemu",
    cli="qm",
    create_task="qmcreate",
    config=PveClient.vm_config,
    create=PveClient.create_vm,
    update=PveClient.update_vm_config,
    start=PveClient.start_vm,
    stop=PveClient.stop_vm,
    status=_vm_status,
    unlock=PveClient.unlock_vm,
    destroy=PveClient.destroy_vm,
)
CT = GuestKind(
    noun="CT",
    holder="container",
    path="lxc",
    cli="pct",
    create_task="vzcreate",
    config=PveClient.lxc_config,
    create=PveClient.create_lxc,
    update=PveClient.update_lxc_config,
    start=PveClient.start_lxc,
    stop=PveClient.stop_lxc,
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


def locked(guest: Guest, lock: str) -> str:
    """Why pvegpu leaves a guest with `lock: <lock>` alone, with the task that holds the lock (the guest's
    newest task) and the exact command that removes it. The only lock pvegpu removes itself is that of its
    own dead create (`converge`, `_dead_create`)."""
    try:
        tasks: tuple[TaskStatus, ...] | PveError = guest.api.guest_tasks(guest.node, guest.vmid)
    except PveError as error:
        tasks = error
    return _locked_by(guest, lock, tasks)


def _locked_by(guest: Guest, lock: str, tasks: tuple[TaskStatus, ...] | PveError) -> str:
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
        f"(exit status: {task.exitstatus}): {check}"
    )


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
) -> Generator[FunctionCommand, None, None]:
    """Yield what makes `guest` hold its config: when absent, its creation with `create` (every key); else
    the PUT of `diff(current values)` with the read's digest, each change logged. Noop with the sentence
    `unchanged` when nothing differs. `diff` may raise OperationError (a refusal).

    `ledger` keeps pvegpu's record of each create it sends (pvegpu/create_records.py; None: no records).
    A guest locked `create`, or never completely created, is what a create left: when its create task has
    ended and the record proves it pvegpu's, a warning names the task and the guest is unlocked, destroyed
    and created again in this run; else it is reported with its task and the exact command (`locked`,
    `_half_made`), untouched. Any other lock is reported (`locked`)."""
    current = guest.read_config(refuse_locked=False)
    if current is None:
        shown = " ".join(f"{key}={create[key]}" for key in sorted(create))
        logger.info(f"{host.print_prefix}{guest.label}: create {shown}")
        yield api_command(_create, guest, create, diff, timeout_s, ledger)
        return
    lock = current.values.get("lock")
    if left_by_a_create(current.values):
        marks = unfinished(current.values)
        logger.warning(f"{host.print_prefix}{_dead_create(guest, current, marks, ledger)}")
        remade = partial(_create, guest, create, diff, timeout_s, ledger)
        yield api_command(_remake, guest, current, timeout_s, remade)
        return
    if lock is not None:
        raise OperationError(locked(guest, str(lock)))
    if ledger is not None:  # whole: a record left by a create whose reading back failed proves nothing now
        ledger.forget(guest.node, guest.kind.path, guest.vmid)
    change = diff(current.values)
    if not change.changed:
        host.noop(unchanged)
        return
    for key, value in sorted(change.set.items()):
        logger.info(f"{host.print_prefix}{guest.label} {key}: {current.values.get(key)} -> {value}")
    for key in change.delete:
        logger.info(f"{host.print_prefix}{guest.label} {key}: delete")
    yield api_command(_update, guest, change, current, diff)


Diff = Callable[[Mapping[str, object]], ConfigChange]


def _dead_create(
    guest: Guest, current: GuestConfig, marks: Sequence[str], ledger: CreateLedger | None
) -> str:
    """The warning for the leftovers of pvegpu's own dead create of `guest` (locked `create`, or `marks` of
    an unfinished create), which `_remake` replaces; OperationError with today's report (`locked`,
    `_half_made`) when its create task still runs, is not the newest task, is not provably pvegpu's
    (pvegpu/plan/dead_create.py, the reason logged), or pvegpu may not remove it."""
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
    record = None if ledger is None else ledger.read(guest.node, guest.kind.path, guest.vmid)
    user = "" if ledger is None else ledger.api_user
    proof = ownership(record, task.upid, guest.kind.create_task, guest.vmid, user)
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
    if refusal is not None:
        logger.info(f"{host.print_prefix}{guest.label}: the dead create {task.upid} is {refusal}")
        raise OperationError(report)
    ended = f"which no longer runs (exit status: {task.exitstatus}; {proof.why})"
    if lock is not None:
        return (
            f"{guest.label} is locked (create) by pvegpu's create task {task.upid}, {ended}: removing the "
            "lock, destroying what it left and creating it again"
        )
    return (
        f"{guest.label} on {guest.node} was never completely created ({'; '.join(marks)}) by pvegpu's "
        f"create task {task.upid}, {ended}: destroying what it left and creating it again"
    )


def _remake(guest: Guest, leftover: GuestConfig, timeout_s: float, create: Callable[[], None]) -> None:
    """Unlock (with the digest of the read that judged it) and destroy what pvegpu's dead create left,
    waiting for the destroy task, then `create` it (`_create`)."""
    unlock, destroy = guest.kind.unlock, guest.kind.destroy
    assert destroy is not None  # _dead_create refuses a kind without
    if "lock" in leftover.values:
        assert unlock is not None
        failure = attempt(lambda: unlock(guest.api, guest.node, guest.vmid, leftover.digest))
        if failure is not None:
            raise OperationError(f"{guest.label} not unlocked: {failure.line}; nothing destroyed")
    endpoint = f"DELETE /nodes/{guest.node}/{guest.kind.path}/{guest.vmid}"
    failure = attempt(lambda: guest.api.wait_task(destroy(guest.api, guest.node, guest.vmid), timeout_s))
    said = what_came_back(failure, endpoint)
    if _read_back(guest, said, "destroyed") is not None:
        raise OperationError(f"{guest.label} not destroyed: {said}; not created again, run again")
    create()


def _create(
    guest: Guest, params: Mapping[str, str], diff: Diff, timeout_s: float, ledger: CreateLedger | None = None
) -> None:
    endpoint = f"POST /nodes/{guest.node}/{guest.kind.path}"
    sent = int(time.time())

    def post_and_wait() -> None:
        _record(guest, ledger, CreateRecord(upid=None, sent=sent))  # before the POST: it may never answer
        upid = guest.kind.create(guest.api, guest.node, guest.vmid, params)
        _record(guest, ledger, CreateRecord(upid=upid, sent=sent))
        guest.api.wait_task(upid, timeout_s)

    failure = attempt(post_and_wait)
    said = what_came_back(failure, endpoint)
    after = _read_back(guest, said, "created")
    if after is None:
        _forget(guest, ledger)  # nothing was made: nothing left to prove
        found = "" if failure else f", but GET {guest.config_endpoint} finds no config"
        raise OperationError(f"{guest.label} not created: {said}{found}")
    if "lock" in after.values:
        lock = locked(guest, str(after.values["lock"]))
        raise OperationError(f"{guest.label} not completely created after {said}: {lock}")
    marks = unfinished(after.values)
    if marks:
        raise OperationError(f"{_half_made(guest, marks)} (after {said})")
    _forget(guest, ledger)  # whole
    left = diff(after.values)
    if left.changed:
        raise OperationError(
            f"{guest.label} created, but {_differences(left, after)} after {said}; run again"
        )
    _accepted(guest, failure)


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
    if ledger is not None:
        ledger.forget(guest.node, guest.kind.path, guest.vmid)


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
    kind: GuestKind,
    api: PveClient,
    node: str,
    vmid: int,
    timeout_s: float,
    unbound: Sequence[str] = (),
    recheck: Callable[[Host], Sequence[str]] | None = None,
    after_start: Callable[[], None] | None = None,
) -> Generator[FunctionCommand, None, None]:
    """Start guest `vmid` unless it runs; wait for the start task (its failure carries Proxmox's message,
    e.g. `PCI device mapping invalid (hardware probably changed): ...`) and until it reports running.

    `unbound` lists the passed GPUs' functions not bound to vfio-pci on the node (a VM's): starting is
    refused while any is (deploy/host.py binds them). With `recheck` (host -> unbound functions, read again
    when the start executes), the refusal waits until then: an earlier operation of the same run (the host
    role's reboot, deploy/site.py) may bind them. `after_start` runs once this run has started the guest
    (e.g. waiting until a new VM's guest answers on SSH); its OperationError fails the host.
    """
    guest = Guest(kind, api, node, vmid)
    if guest.read_config() is not None and guest.read_status() == "running":
        host.noop(f"{guest.label} is running on {node}")
        return
    if unbound and recheck is None:
        raise OperationError(_refusal(guest, unbound))
    logger.info(f"{host.print_prefix}{guest.label}: start on {node}")
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
    kind: GuestKind,
    api: PveClient,
    node: str,
    vmid: int,
    profile: str,
    allow_stop: bool,
    timeout_s: float,
    prefix: str | None = None,
) -> Generator[FunctionCommand, None, None]:
    """For `profile`, which does not use guest `vmid`: set `onboot: 0` (PUT with the read's digest), then
    stop it and wait until it is stopped. It is never deleted: its disks are kept.

    With `prefix` (a VM), only a guest whose config maps pvegpu's `<prefix>N` PCI mappings is pvegpu's:
    any other is left alone. Noop when the guest does not exist, is not pvegpu's, or is stopped with
    `onboot: 0`. Stopping a running guest takes the GPUs away from it, as a reboot would: with `allow_stop`
    false (`pve_host.allow_reboot`) nothing is changed; a warning and the noop say what would be done.
    """
    guest = Guest(kind, api, node, vmid)
    config = guest.read_config(refuse_locked=False)  # a locked guest that is not pvegpu's is left alone
    if config is None:
        host.noop(f"{guest.label} does not exist on {node}: no {kind.holder} holds the GPUs")
        return
    if prefix is not None and not maps_gpus(config.values, prefix):
        host.noop(
            f"{guest.label} on {node} maps none of pvegpu's {prefix}N mappings: not pvegpu's, left alone"
        )
        return
    if "lock" in config.values:
        raise OperationError(locked(guest, str(config.values["lock"])))
    running = guest.read_status() == "running"
    onboot = str(config.values.get("onboot", "0")) == "1"
    if running and not allow_stop:
        message = (
            f"profile {profile}: {guest.label} is running on {node} with the GPUs; would stop it and "
            "set onboot 0 (pve_host.allow_reboot is false: not stopping it)"
        )
        logger.warning(f"{host.print_prefix}{message}")
        host.noop(message)
        return
    if not running and not onboot:
        host.noop(f"{guest.label} on {node} is stopped and not started at boot (onboot 0)")
        return
    if onboot:
        logger.info(f"{host.print_prefix}{guest.label}: onboot 1 -> 0 (profile {profile})")
        yield api_command(_no_onboot, guest, config.digest, config.values.get("onboot"))
    if running:
        logger.info(f"{host.print_prefix}{guest.label}: stop on {node} (profile {profile})")
        yield api_command(_stop, guest, timeout_s)


def _no_onboot(guest: Guest, digest: str, onboot: object) -> None:
    failure = attempt(lambda: guest.kind.update(guest.api, guest.node, guest.vmid, {"onboot": 0}, digest, ()))
    said = what_came_back(failure, f"PUT {guest.config_endpoint}")
    after = _read_back(guest, said, "updated")
    if after is not None and str(after.values.get("onboot", "0")) == "0":
        _accepted(guest, failure)
        return
    if after is not None and after.values.get("onboot") == onboot:
        unchanged = "" if failure else f", but reading it back shows onboot {onboot}"
        raise OperationError(f"{guest.label} onboot not cleared, nothing overwritten: {said}{unchanged}")
    held = "is gone" if after is None else f"has onboot {after.values.get('onboot')}"
    raise OperationError(f"{guest.label} {held} after {said}; run again")
