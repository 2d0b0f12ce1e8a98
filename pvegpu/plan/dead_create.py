"""Whether the dead create task a guest's leftovers came from is pvegpu's own. Pure.

pvegpu records each create before it POSTs it (pvegpu/create_records.py): the time it sent the POST, and the
task's UPID once the POST answered with one. A create killed under pvesh never answers (pvesh prints the
UPID only when the task has ended), so the UPID is often unknown. The dead task is pvegpu's when:

- the record has its UPID, the very task; or
- the record has no UPID, and the task (`UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:`)
  ran as the user pvegpu acts as and started when the POST was sent (within `CLOCK_SKEW_S` of it: the
  node's clock is not this machine's, and Proxmox starts a create's task as soon as the POST arrives).

Anything else (no record, another task, another user, an older task) is not provably pvegpu's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

CLOCK_SKEW_S = 60
_UPID = re.compile(
    r"UPID:[a-zA-Z0-9.\-]+:[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:(?P<start>[0-9A-Fa-f]{8}):(?P<type>[^:\s/]+):"
    r"(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):"
)


@dataclass(frozen=True)
class CreateRecord:
    """pvegpu's record of its create of a guest: the task's `upid` (None while the POST has not answered
    with one) and when the POST was sent (`sent`, Unix seconds of this machine's clock)."""

    upid: str | None
    sent: int


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


def _unanswered(task: re.Match[str], sent: int, api_user: str) -> Ownership:
    """Whether `task` is the create pvegpu sent at `sent` whose POST never answered."""
    if task["user"] != api_user:
        return Ownership(False, f"the task ran as {task['user']}, pvegpu acts as {api_user}")
    started = int(task["start"], 16)
    if abs(started - sent) > CLOCK_SKEW_S:
        return Ownership(
            False, f"the task started at {_utc(started)}, not when pvegpu sent its create ({_utc(sent)})"
        )
    return Ownership(
        True, f"it started as {api_user} within {CLOCK_SKEW_S} s of pvegpu's POST, which never answered"
    )


def _utc(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
