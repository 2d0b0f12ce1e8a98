"""GPU peer-to-peer in the VM (`vm.p2p`, plan/p2p.py decides): the clique parts of `args` and the probe,
driven from the node through the Proxmox API and the VM's guest agent.

`p2p_clique` runs after the VM is converged and started (roles/q35_vm.py):

- `on`: the clique is part of the VM's config (plan/vm.py); this only warns that P2P is on unproven.
  (`off` needs no operation: the VM's config converge removes pvegpu's clique parts.)
- `probe`: waits (noop, saying so) while the guest has no NVIDIA driver or no SGLang venv (deploy/guest.py
  installs them). Then the guest's record (`RECORD_PATH`, agent file-read) is compared with what it depends
  on: the guest's driver and kernel (the probe script's read-only `identity`, run by the guest's python3
  through agent exec) and the VM's GPU devices with the clique. A record that holds, with the clique as its
  verdict wants it, is a noop that repeats the verdict. Else, while executing: the clique's GPUs mapped
  single-function on this node (their map lines' paths name the display function, PUT with the mapping's
  digest: QEMU's `-set` can address only such a device, plan/p2p.py) and the clique parts set when missing
  (PUT with digest), then the VM restarted (shutdown, stop when that fails, start, agent answering);
  the probe script written in the guest and run under `timeout` (exec, then exec-status polled until a
  deadline: a hang is bounded here and killed in the guest); its result judged (plan/p2p.py `judge`); on
  any failure the clique parts removed, the whole-slot paths restored and the VM restarted again (SHM),
  each failure a warning line; the verdict recorded in the guest (agent file-write, read back). A guest
  that comes back from the restart without its software (a lab guest does) is probed by a later run, the
  clique in place.
- a VM that does not start with the clique (QEMU refuses it): the clique parts removed, the whole-slot
  paths restored, the VM started again, and one warning naming the VM with the start's own error line
  (QEMU's message, pvegpu/operations/start_failure.py); the verdict SHM is recorded with it, so later
  runs keep SHM until the record no longer holds.

pvegpu restarts the VM right after adding its clique parts, so parts found in the config are taken to be in
effect (a run cut between the two probes a VM without them: the probe then fails safe, to SHM). A probe that
fails never fails the host: the SHM plan is always safe. A restart cuts the guest's SSH connection, so
nothing restarts in a run that also converges the guest (deploy/site.py with the guest up): the probe says it
is deferred, and deploy/vm.py runs it.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts.p2p_record import parse_record
from pvegpu.models.p2p import RECORD_PATH, Identity, Record
from pvegpu.operations.api_command import api_command, one_line_errors
from pvegpu.operations.pve_guest import Guest
from pvegpu.operations.vm import StartFailedError, cold_restart, guest_in_run
from pvegpu.plan.hostpci import HOSTPCI_KEY, HostPciError, parse_hostpci
from pvegpu.plan.mapping import managed_index, with_path_shape
from pvegpu.plan.p2p import (
    DEFERRED,
    NO_DRIVER,
    NO_VENV,
    PROBE_PATH,
    UNPROVEN,
    Judgement,
    clique_devices,
    crash_failure,
    judge,
    not_started_failure,
    own_clique,
    timeout_failure,
    vm_devices,
)
from pvegpu.plan.vm import cpu_hidden, merge_args
from pvegpu.pve.errors import PveError
from pvegpu.pve.transport import Value
from pvegpu.run.wait import WaitTimeoutError, wait_until

KILL_AFTER_S = 5  # `timeout --kill-after`: a probe that ignores SIGTERM gets SIGKILL this much later
POLL_S = 1.0


def probe_script() -> str:
    """The probe's source (pvegpu/data/p2p/p2p_probe.py), as written in the guest."""
    return resources.files("pvegpu").joinpath("data", "p2p", "p2p_probe.py").read_text()


@dataclass(frozen=True)
class Exec:
    """What an agent exec ended with; `exitcode` None when it did not end before its deadline."""

    exitcode: int | None
    out: str = ""
    err: str = ""


def guest_exec(guest: Guest, argv: Sequence[str], deadline_s: float, input_data: str | None = None) -> Exec:
    """Run `argv` in the guest (agent exec) and poll exec-status until it ends or `deadline_s` passed."""
    params: dict[str, Value | None] = {"command": list(argv), "input-data": input_data}
    started = guest.api.agent_post(guest.node, guest.vmid, "exec", params)
    pid = started.get("pid") if isinstance(started, Mapping) else None
    if not isinstance(pid, int):
        raise PveError(500, f"agent exec: no pid in {started!r}")
    ended: dict[str, object] = {}

    def pending() -> str | None:
        status = guest.api.agent_get(guest.node, guest.vmid, "exec-status", {"pid": pid})
        if status.get("exited") in (1, True):
            ended.update(status)
            return None
        return f"pid {pid} still runs"

    try:
        wait_until(pending, deadline_s, f"{guest.label}: {argv[0]}", interval_s=POLL_S)
    except WaitTimeoutError:
        return Exec(None)
    code = ended.get("exitcode")
    signal = ended.get("signal")
    return Exec(
        int(code) if isinstance(code, int) else 128 + int(signal) if isinstance(signal, int) else -1,
        str(ended.get("out-data", "")),
        str(ended.get("err-data", "")),
    )


def _write(guest: Guest, path: str, content: str) -> None:
    """Write `path` in the guest (its directory made first) and read it back."""
    folder = path.rsplit("/", 1)[0]
    guest_exec(guest, ["mkdir", "-p", folder], 60)
    guest.api.agent_post(guest.node, guest.vmid, "file-write", {"file": path, "content": content})
    if guest.api.agent_file_read(guest.node, guest.vmid, path) != content:
        raise OperationError(f"{guest.label}: {path} not written in the guest (reading it back differs)")


@operation(is_idempotent=False)
@one_line_errors
def p2p_clique(
    *,
    guest: Guest,
    mode: Literal["probe", "on"],
    clique: str,
    prefix: str,
    venv: str,
    probe_timeout_s: float,
    timeout_s: float,
) -> Generator[FunctionCommand, None, None]:
    """GPU peer-to-peer in VM `guest` as `mode` wants it (module docstring); `clique` is
    plan/p2p.py's `clique_args` for the VM's GPUs ('' when none may peer), `prefix` the mapping ids' prefix
    (`vm.mapping_prefix`: the mappings whose paths the probe shapes), `venv` the guest's SGLang venv.
    Not idempotent in the strict sense: a probe that runs restarts the VM (it runs only when no valid
    record exists)."""
    config = guest.read_config()
    if config is None:
        host.noop(f"VM {guest.vmid} does not exist: no P2P clique to manage")
        return
    if mode == "on":
        logger.warning(f"{host.print_prefix}{UNPROVEN}")
        host.noop(f"VM {guest.vmid}: vm.p2p on, clique {clique or 'none (no GPUs may peer)'}")
    else:
        yield from _probe_mode(
            guest,
            prefix=prefix,
            config=config.values,
            venv=venv,
            clique=clique,
            probe_timeout_s=probe_timeout_s,
            timeout_s=timeout_s,
        )


def _probe_mode(
    guest: Guest,
    *,
    prefix: str,
    config: Mapping[str, object],
    venv: str,
    clique: str,
    probe_timeout_s: float,
    timeout_s: float,
) -> Generator[FunctionCommand, None, None]:
    """`probe` (module docstring): noop while the probe cannot run or its record holds; else the probe."""
    present = own_clique(str(config.get("args", "")))
    pending, identity = _pending(guest, clique), None
    try:
        identity = None if pending is not None else _identity(guest, config, clique)
        if identity is not None and not identity.driver:
            pending = NO_DRIVER
        if pending is None and not _has_venv(guest, venv):
            pending = NO_VENV
    except (PveError, OperationError) as error:  # the guest does not let itself be read: probed later
        pending = f"{guest.label}: P2P probe pending: {error}"
    if pending is not None or identity is None:
        logger.info(f"{host.print_prefix}{pending}")
        host.noop(str(pending))
        return
    record = parse_record(guest.api.agent_file_read(guest.node, guest.vmid, RECORD_PATH))
    if record is not None and record.mode == "probe" and record.identity == identity:
        if present == (clique if record.verdict == "p2p" else ""):
            _report(record)
            host.noop(f"{guest.label}: P2P probe result holds ({record.verdict}) for {_said(identity)}")
            return
        if record.verdict == "shm":  # the failed probe's clique is back (by hand?): remove it again
            yield api_command(_remove_clique, guest, prefix, timeout_s)
            return
    shown = "no record" if record is None else "the record is for another driver, kernel or devices"
    logger.info(f"{host.print_prefix}{guest.label}: P2P probe ({shown}): clique {clique}")
    yield api_command(_probe, guest, prefix, venv, (clique, identity), (probe_timeout_s, timeout_s))


def _pending(guest: Guest, clique: str) -> str | None:
    """Why the probe cannot run now (the SHM plan stays), or None."""
    if not clique:
        return f"{guest.label}: no GPUs may peer (no root complex holds two): nothing to probe, SHM plan"
    if guest.read_status() != "running":
        return f"{guest.label} is not running: P2P probe pending"
    try:
        guest.api.agent_get(guest.node, guest.vmid, "get-fsinfo")
    except PveError as error:
        return f"{guest.label}: P2P probe pending: its guest agent does not answer ({error.line})"
    return None


def _has_venv(guest: Guest, venv: str) -> bool:
    return guest_exec(guest, ["test", "-x", f"{venv}/bin/python"], 60).exitcode == 0


def _judged(ran: Exec, probe_timeout_s: float) -> Judgement:
    """The verdict of a probe run: killed by its time bound (exit status 124/137, or still running at the
    deadline) is a hang; any other failed exit a crash; else `judge` of its last output line."""
    if ran.exitcode is None or ran.exitcode in (124, 137):
        return Judgement("shm", (timeout_failure(probe_timeout_s),), "")
    if ran.exitcode != 0:
        return Judgement("shm", (crash_failure(ran.exitcode, ran.err),), "")
    try:
        return judge(json.loads(ran.out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return Judgement("shm", (crash_failure(0, f"no JSON result: {ran.out[-200:]!r}"),), "")


def _provisioned(guest: Guest) -> bool:
    """The guest's NVIDIA driver answers (nvidia-smi)."""
    argv = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    return guest_exec(guest, argv, 60).exitcode == 0


def _said(identity: Identity) -> str:
    return f"driver {identity.driver or 'unknown'}, kernel {identity.kernel}"


def _report(record: Record) -> None:
    if record.verdict == "p2p":
        logger.info(f"{host.print_prefix}P2P proven in the VM ({record.summary}): NCCL plan P2P")
        return
    for failure in record.failures:
        logger.warning(f"{host.print_prefix}P2P probe failed: {failure}; NCCL plan SHM")


def _identity(guest: Guest, config: Mapping[str, object], clique: str) -> Identity:
    """The guest's driver and kernel (the probe script's `identity`, run by the guest's own python3: it needs
    no venv) and the VM's GPU devices with `clique`."""
    ran = guest_exec(guest, ["python3", "-", "identity"], 120, probe_script())
    try:
        read = json.loads(ran.out)
        return Identity(str(read["driver"]), str(read["kernel"]), vm_devices(config, clique))
    except (ValueError, KeyError, TypeError):
        raise OperationError(
            f"{guest.label}: the P2P probe's identity gave no result ({crash_failure(ran.exitcode, ran.err)})"
        ) from None


def _set_clique(guest: Guest, prefix: str, clique: str, timeout_s: float, *, restart: bool) -> bool:
    """The VM's GPUs mapped as `clique` needs (`_shape_paths`) and `args` with pvegpu's clique parts replaced
    by `clique` (PUT with the read's digest), then, when `restart` and either changed, the VM cold-restarted
    until its agent answers (a failed start: StartFailedError). Whether anything changed. Refused: a clique
    on a VM whose `cpu` has `hidden=1`."""
    current = guest.read_config()
    if current is None:
        raise OperationError(f"{guest.label} disappeared")
    if clique and cpu_hidden(current.values.get("cpu")):
        raise OperationError(
            f"{guest.label}: cpu {current.values['cpu']} has hidden=1 (kvm=off), with which the guest's "
            "NVIDIA driver ignores the GPUDirect clique: not set (pvegpu's cpu value has no hidden; run "
            "deploy/vm.py again)"
        )
    # Never a clique part on a whole slot, even for a run cut half-way: paths first when the clique comes,
    # args first when it goes (the other way round is only a VM without its HDMI audio function).
    single = clique_devices(clique)
    shaped = bool(clique) and _shape_paths(guest, prefix, current.values, single)
    now = str(current.values.get("args", ""))
    args = merge_args(now, None, clique)
    if args != now:
        try:
            if args:
                guest.api.update_vm_config(guest.node, guest.vmid, {"args": args}, current.digest)
            else:
                guest.api.update_vm_config(guest.node, guest.vmid, {}, current.digest, ("args",))
        except PveError as error:
            raise OperationError(f"{guest.label}: args not set: {error.line}") from None
        logger.info(f"{host.print_prefix}{guest.label}: args: {args or '(deleted)'}")
    shaped = shaped or (not clique and _shape_paths(guest, prefix, current.values, single))
    changed = shaped or args != now
    if changed and restart:
        _restart(guest, timeout_s)
    return changed


def _shape_paths(guest: Guest, prefix: str, config: Mapping[str, object], single: frozenset[int]) -> bool:
    """Each `hostpciN: mapping=<prefix><M>` of the VM gets this node's map line of its mapping naming the
    display function (N in `single`) or the whole slot (else), PUT with the mapping's digest; the other
    nodes' lines are left as they are. Whether a mapping was written."""
    written = False
    for key in sorted((k for k in config if HOSTPCI_KEY.fullmatch(k)), key=lambda k: int(k[7:])):
        try:
            mapping_id = parse_hostpci(str(config[key])).get("mapping")
        except HostPciError:
            continue  # not pvegpu's (the VM converge refuses the slot where it needs it)
        if mapping_id is None or managed_index(prefix, mapping_id) is None:
            continue
        try:
            state = guest.api.mapping(mapping_id)
            if state is None:
                continue  # Proxmox's start check names a missing mapping
            shaped = with_path_shape(state.mapping, guest.node, int(key[7:]) in single)
            if shaped == state.mapping:
                continue
            guest.api.update_mapping(shaped, state.digest)
        except PveError as error:
            raise OperationError(f"{guest.label}: mapping {mapping_id} not reshaped: {error.line}") from None
        how = "single-function (its display function)" if int(key[7:]) in single else "whole (every function)"
        logger.info(f"{host.print_prefix}{guest.label}: mapping {mapping_id} on {guest.node}: {how}")
        written = True
    return written


def _remove_clique(guest: Guest, prefix: str, timeout_s: float) -> None:
    if guest_in_run(host):
        logger.info(f"{host.print_prefix}{guest.label}: {DEFERRED}")
        return
    _set_clique(guest, prefix, "", timeout_s, restart=True)


def _restart(guest: Guest, timeout_s: float) -> None:
    """Cold-restart the VM (pvegpu/operations/vm.py `cold_restart`), then wait until its agent answers."""
    cold_restart(guest, timeout_s)
    _agent_answers(guest, timeout_s, "restarted")


def _agent_answers(guest: Guest, timeout_s: float, done: str) -> None:
    """Wait until the VM's guest agent answers after it was `done` (`restarted`, `started`)."""
    api, node, vmid = guest.api, guest.node, guest.vmid

    def answering() -> str | None:
        try:
            api.agent_get(node, vmid, "get-fsinfo")
        except PveError as error:
            return error.line
        return None

    try:
        wait_until(answering, timeout_s, f"{guest.label}: the guest agent once {done}")
    except WaitTimeoutError as timeout:
        raise OperationError(str(timeout)) from None
    logger.info(f"{host.print_prefix}{guest.label} {done}, its guest agent answers")


def _probe(
    guest: Guest, prefix: str, venv: str, planned: tuple[str, Identity], timeouts: tuple[float, float]
) -> None:
    """Set the clique, restart, run the probe bounded in time, judge; on failure back to no clique (SHM).
    `timeouts`: the probe's bound, then the API's. An API or agent call that fails is an OperationError
    naming it (the clique may then stay: the guest's plan stays SHM without a record, and the next run
    probes again)."""
    if guest_in_run(host):
        logger.info(f"{host.print_prefix}{guest.label}: {DEFERRED}")
        return
    try:
        _probe_steps(guest, prefix, venv, planned, timeouts)
    except PveError as error:
        raise OperationError(f"{guest.label}: P2P probe: {error.line}") from None


def _probe_steps(
    guest: Guest, prefix: str, venv: str, planned: tuple[str, Identity], timeouts: tuple[float, float]
) -> None:
    clique, identity = planned
    probe_timeout_s, timeout_s = timeouts
    try:
        restarted = _set_clique(guest, prefix, clique, timeout_s, restart=True)
    except StartFailedError as failed:
        _fall_back(guest, prefix, identity, failed, timeout_s)
        return
    if restarted and not (_has_venv(guest, venv) and _provisioned(guest)):
        # A guest that lost its software with the restart (the lab's guests do) is probed once it has it.
        logger.info(f"{host.print_prefix}{guest.label} restarted with the clique; {NO_VENV}")
        return
    _write(guest, PROBE_PATH, probe_script())
    argv = [
        "timeout", f"--kill-after={KILL_AFTER_S}", f"{probe_timeout_s:g}",
        f"{venv}/bin/python", PROBE_PATH, "run",
    ]  # fmt: skip
    ran = guest_exec(guest, argv, probe_timeout_s + KILL_AFTER_S + 10)
    judgement = _judged(ran, probe_timeout_s)
    if judgement.failures:
        _set_clique(guest, prefix, "", timeout_s, restart=True)
    record = Record("probe", judgement.verdict, identity, judgement.failures, judgement.summary)
    _write(guest, RECORD_PATH, record.text())
    _report(record)


def _fall_back(
    guest: Guest, prefix: str, identity: Identity, failed: StartFailedError, timeout_s: float
) -> None:
    """The VM did not start with the clique: remove it, restore the whole-slot paths, start the VM again
    (it is stopped: a start is a cold start), say so in one line and record SHM with the start's error."""
    _set_clique(guest, prefix, "", timeout_s, restart=False)
    try:
        guest.api.wait_task(guest.api.start_vm(guest.node, guest.vmid), timeout_s)
    except PveError as error:
        raise OperationError(
            f"{guest.label} did not start with the GPUDirect clique ({failed.line}), nor without it: "
            f"{error.line}"
        ) from None
    logger.warning(
        f"{host.print_prefix}{guest.label} did not start with the GPUDirect clique: {failed.line}; clique "
        "removed, its GPUs passed whole again, VM started: NCCL plan SHM"
    )
    _agent_answers(guest, timeout_s, "started")
    record = Record("probe", "shm", identity, (not_started_failure(failed.line),), "")
    _write(guest, RECORD_PATH, record.text())
