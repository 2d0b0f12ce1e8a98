"""Whether the dead create task a guest's leftovers came from is pvegpu's own. Pure.

pvegpu records each create before it POSTs it (pvegpu/local/create_records.py): the time it sent the POST,
and the
task's UPID once the POST answered with one. A create killed under pvesh never answers (pvesh prints the
UPID only when the task has ended), so the UPID is often unknown. The dead task is pvegpu's when:

- the record has its UPID, the very task; or
- the record has no UPID, and the task (`UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:`)
  ran as the user pvegpu acts as and started when the POST was sent (within `CLOCK_SKEW_S` of it: the
  node's clock is not this machine's, and Proxmox starts a create's task as soon as the POST arrives).

Anything else (no record, another task, another user, an older task) is not provably pvegpu's. And it
holds only when the task list is the node's whole list (`newest_task`: the identity holds `Sys.Audit` on
`/nodes/<node>`, else Proxmox lists only its own tasks, pve-manager API2/Tasks.pm) with no task running or
started after the create; and a leftover that holds more than the `lock: create` stub (its create wrote the
final config) carries the record's nonce on its own description line (`pvegpu-create: <nonce>`).

What the dead create allocated (`create_volumes`): the volumes guest `vmid` owns on the storages the
create's disk keys named (`<storage>:<size>`, `<storage>:cloudinit`), created no earlier than the record's
`sent` less `CLOCK_SKEW_S` (the volume's `ctime` is the node's clock, `sent` this machine's; Proxmox
allocates a create's disks only after the POST arrived). An older volume of `vmid`, or one without a
`ctime`, is not provably the create's: it is left and named.

What holds the leftover (`held_by`): Proxmox refuses to destroy a VM without `purge` while it is an HA
resource or a replication job replicates it (qemu-server API2/Qemu.pm destroy_vm), and pvegpu never purges,
so either refuses the destroy before anything is unlocked. A backup job that includes the vmid
(`backup_jobs_of`) does not refuse it: it is named, not edited.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pvegpu.models.pve import BackupJob, ReplicationJob, StorageVolume, TaskStatus

CLOCK_SKEW_S = 60
_DRIVE_KEY = re.compile(r"(?:ide|sata|scsi|virtio|efidisk|tpmstate)\d+")
_NEW_VOLUME = re.compile(
    r"(?:file=)?(?P<storage>[a-zA-Z][a-zA-Z0-9\-_.]*[a-zA-Z0-9]):(?:\d+(?:\.\d+)?|cloudinit)"
)
NONCE_KEY = "pvegpu-create"
_NONCE_LINE = re.compile(rf"^{NONCE_KEY}: (?P<nonce>[0-9a-f]{{32}})$", re.MULTILINE)
_UPID = re.compile(
    r"UPID:[a-zA-Z0-9.\-]+:[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:(?P<start>[0-9A-Fa-f]{8}):(?P<type>[^:\s/]+):"
    r"(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):"
)


@dataclass(frozen=True)
class CreateRecord:
    """pvegpu's record of its create of a guest: the task's `upid` (None while the POST has not answered
    with one), when the POST was sent (`sent`, Unix seconds of this machine's clock) and the `nonce` the
    create carried in its description (None in a record written before creates carried one)."""

    upid: str | None
    sent: int
    nonce: str | None = None


@dataclass(frozen=True)
class Ownership:
    """Whether a dead create task is pvegpu's (`own`), and why, as a phrase for a message."""

    own: bool
    why: str


def ownership(
    record: CreateRecord | None, upid: str, create_type: str, vmid: int, api_user: str
) -> Ownership:
    """Whether task `upid`, the newest task of guest `vmid` and ended, is pvegpu's create of it: a task of
    type `create_type` (`qmcreate`, `vzcreate`) for `vmid` that `record` proves pvegpu's (module
    docstring); `api_user` is who pvegpu's create runs as (`root@pam` under pvesh, or over https when the
    create carries a root-only key and went through root's pvesh; else the token id: `PveClient.acts_as`)."""
    task = _UPID.fullmatch(upid)
    if task is None:
        return Ownership(False, f"{upid!r} is not a Proxmox task id")
    if task["type"] != create_type or task["id"] != str(vmid):
        return Ownership(
            False, f"its last task is a {task['type']} of {task['id'] or 'nothing'}, not a create"
        )
    if record is None:
        return Ownership(False, "pvegpu has no record of creating it")
    if record.upid is None:
        return _unanswered(task, record.sent, api_user)
    if record.upid == upid:
        return Ownership(True, "pvegpu recorded its task id when the POST answered")
    return Ownership(False, f"pvegpu's create was task {record.upid}")


def start_time(upid: str) -> int | None:
    """A UPID's start time (its hex `starttime` field, PVE::Tools::upid_decode), None for no UPID."""
    task = _UPID.fullmatch(upid)
    return None if task is None else int(task["start"], 16)


def newest_task(tasks: Sequence[TaskStatus], sees_all: bool, where: str) -> TaskStatus | str:
    """The newest of a guest's tasks by UPID start time (ties by UPID, as Proxmox sorts them), or why the
    list proves nothing: `sees_all` false (the identity lacks Sys.Audit on `where`, `/nodes/<node>`: it is
    shown only its own tasks), no task, a task that still runs (named), or a task that is not a UPID."""
    if not sees_all:
        return f"the task list is not the whole of {where}'s (no Sys.Audit on {where}: only its own tasks)"
    if not tasks:
        return "Proxmox lists no task of it"
    for task in tasks:
        if task.status == "running":
            return f"task {task.upid} still runs"
        if start_time(task.upid) is None:
            return f"{task.upid!r} is not a Proxmox task id"
    return max(tasks, key=lambda task: (start_time(task.upid) or 0, task.upid))


def with_nonce(description: object, nonce: str) -> str:
    """`description` (None: none) with the line `pvegpu-create: <nonce>` added; other lines kept."""
    kept = [line for line in str(description or "").splitlines() if _NONCE_LINE.fullmatch(line) is None]
    return "\n".join([*kept, f"{NONCE_KEY}: {nonce}"])


def without_nonce(values: Mapping[str, object]) -> dict[str, object]:
    """Config `values` with the `pvegpu-create:` line out of `description` (the key gone if that was all)."""
    out = dict(values)
    if "description" in out:
        text = str(out["description"])
        kept = "\n".join(line for line in text.splitlines() if _NONCE_LINE.fullmatch(line) is None)
        if kept:
            out["description"] = kept + ("\n" if text.endswith("\n") else "")
        else:
            del out["description"]
    return out


def carries_nonce(values: Mapping[str, object], record: CreateRecord) -> Ownership | None:
    """None when config `values` prove nothing either way (only the `lock: create` stub: Proxmox writes
    the create's keys at its end, qemu-server API2/Qemu.pm create_vm), else whether they carry `record`'s
    nonce."""
    if not set(values) - {"lock", "digest"}:
        return None
    found = [match["nonce"] for match in _NONCE_LINE.finditer(str(values.get("description", "")))]
    if record.nonce is not None and found == [record.nonce]:
        return Ownership(True, "its description carries pvegpu's create nonce")
    if not found:
        return Ownership(False, f"its config carries no `{NONCE_KEY}:` line")
    return Ownership(False, f"its `{NONCE_KEY}:` line is not that of pvegpu's create ({', '.join(found)})")


def create_storages(params: Mapping[str, object]) -> tuple[str, ...]:
    """The storages create `params` allocate volumes on (a drive key's `<storage>:<size>` or
    `<storage>:cloudinit`, qemu-server's NEW_DISK_RE), sorted; an existing volume or a CD-ROM allocates
    none."""
    found = set()
    for key, value in params.items():
        if _DRIVE_KEY.fullmatch(key) is None:
            continue
        new = _NEW_VOLUME.fullmatch(str(value).split(",", 1)[0])
        if new is not None:
            found.add(new["storage"])
    return tuple(sorted(found))


@dataclass(frozen=True)
class CreateVolumes:
    """A dead create's volumes (`ours`) and the other volumes of its vmid (`older`), by volid."""

    ours: tuple[str, ...]
    older: tuple[str, ...]


def create_volumes(volumes: Sequence[StorageVolume], vmid: int, record: CreateRecord) -> CreateVolumes:
    """Which of `volumes` (a content listing of the create's storages) guest `vmid`'s dead create
    allocated (module docstring); volumes of another guest are neither."""
    ours: list[str] = []
    older: list[str] = []
    for volume in volumes:
        if volume.vmid != vmid:
            continue
        made_by_it = volume.ctime is not None and volume.ctime >= record.sent - CLOCK_SKEW_S
        (ours if made_by_it else older).append(volume.volid)
    return CreateVolumes(tuple(ours), tuple(older))


def held_by(ha_sids: Sequence[str], jobs: Sequence[ReplicationJob], sid: str, vmid: int) -> str | None:
    """What holds guest `vmid` (HA sid `sid`: `vm:100`, `ct:101`) so that Proxmox refuses its destroy
    without `purge`, as a phrase (`it is HA resource vm:100 and replication job 100-0 replicates it`);
    None when nothing does. `ha_sids`: `GET /cluster/ha/resources`; `jobs`: `GET /cluster/replication`
    (pve-guest-common ReplicationConfig.pm check_for_existing_jobs: any job of the guest)."""
    held = [f"it is HA resource {sid}"] if sid in ha_sids else []
    ids = sorted(job.id for job in jobs if job.guest == vmid)
    if len(ids) == 1:
        held.append(f"replication job {ids[0]} replicates it")
    elif ids:
        held.append(f"replication jobs {', '.join(ids)} replicate it")
    return " and ".join(held) or None


def backup_jobs_of(jobs: Sequence[BackupJob], vmid: int, node: str) -> tuple[str, ...]:
    """The backup jobs that include guest `vmid` on `node` (PVE::VZDump get_included_guests: a job's `pool`,
    else its `vmid` list, else `all` but `exclude`; a job limited to another node leaves it out), each as
    `<id> (<how>)` in `jobs`' order: `vmid list`, `all guests`, or `pool <pool>, if the pool holds it` (a
    pool's members are not read: reading them needs Pool.Audit), `, disabled` added for a job that does not
    run."""
    found = []
    for job in jobs:
        if job.node is not None and job.node != node:
            continue
        if job.pool is not None:
            how = f"pool {job.pool}, if the pool holds it"
        elif job.vmids:
            how = "vmid list" if vmid in job.vmids else ""
        else:
            how = "all guests" if job.all and vmid not in job.exclude else ""
        if how:
            found.append(f"{job.id} ({how}{'' if job.enabled else ', disabled'})")
    return tuple(found)


def _unanswered(task: re.Match[str], sent: int, api_user: str) -> Ownership:
    """Whether `task` is the create pvegpu sent at `sent` whose POST never answered."""
    if task["user"] != api_user:
        return Ownership(False, f"the task ran as {task['user']}, pvegpu acts as {api_user}")
    started = int(task["start"], 16)
    if abs(started - sent) > CLOCK_SKEW_S:
        return Ownership(
            False, f"the task started at {utc(started)}, not when pvegpu sent its create ({utc(sent)})"
        )
    return Ownership(
        True, f"it started as {api_user} within {CLOCK_SKEW_S} s of pvegpu's POST, which never answered"
    )


def utc(seconds: int) -> str:
    """Unix `seconds` as `2026-12-02 12:40:01Z`."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
