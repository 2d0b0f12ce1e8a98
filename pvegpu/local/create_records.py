"""pvegpu's records of the guest creates it sent, so that the next run can prove a dead create its own
(pvegpu/plan/create_proof.py).

Where: on this machine, beside the guest keys of the node's known_hosts file (pvegpu/local/guest_keys.py),
not on the node: the API may be https (no shell on the node), and a record on the node could be written by
anyone who can create guests there. One JSON file per guest, in the folder of the inventory's cluster (the
guest keys' `<scope>`: `pve.cluster`, a standalone node's name, `<pve.owner>@<cluster>` for another owner
id), so two inventories sharing that directory never share a record; written whole (pvegpu.local.files;
0600, in 0700 directories):

    <dir of ssh_known_hosts_file>/guest-keys/<scope>/tasks/<node>-<qemu|lxc>-<vmid>.json
        {"nonce": <32 hex digits, on the create's description line `pvegpu-create: <nonce>`>,
         "sent": <Unix seconds the POST was sent>, "upid": <the task's UPID, or null until the POST answered>}

The record is written before the POST, given the UPID once it answered, and removed once the guest is
verified whole, nothing was created, or the POST was answered with an error (no task of pvegpu's ran: the
guest there is another's, e.g. `VM 100 already exists on node 'pve1'`). A host without
`ssh_known_hosts_file` keeps no records: a dead create is then never provably pvegpu's.

An earlier pvegpu kept the records without the cluster (`guest-keys/tasks/<node>-<kind>-<vmid>.json`): the
first read, write or removal of a guest's record moves it into the scope's folder (a rename: the same file);
one already there with the same bytes makes it a leftover copy, removed; both there and different is
refused (`CreateRecordError`), naming both: which create is this inventory's is not pvegpu's to guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pvegpu.local.files import write_whole
from pvegpu.local.guest_keys import GUEST_KEYS_DIR, key_scope, move_unreplaced
from pvegpu.plan.create_proof import NONCE_KEY, CreateRecord

TASKS_DIR = "tasks"
_MODE = 0o600
_DIRECTORY_MODE = 0o700


class CreateRecordError(OSError):
    """A record of an earlier pvegpu's layout that cannot be moved into place; the message names both
    files. An OSError: a write of the record that meets it is reported as not written."""


@dataclass(frozen=True)
class CreateLedger:
    """The records of one inventory's guest creates on one node (`directory`: `guest-keys/<scope>/tasks`),
    and who pvegpu's create runs as there (`api_user`, the user in its task's UPID: `root@pam` under pvesh,
    and over https for a create that carries a key only root@pam may set, which goes through root's pvesh
    (`PveClient.acts_as`); else the API token id). `earlier`: the folder an earlier pvegpu kept them in
    (`guest-keys/tasks`), None for none."""

    directory: Path
    api_user: str
    earlier: Path | None = None

    def path(self, node: str, kind: str, vmid: int) -> Path:
        """The record of guest `vmid` of `kind` (`qemu`, `lxc`) on `node`."""
        return self.directory / _name(node, kind, vmid)

    def read(self, node: str, kind: str, vmid: int) -> CreateRecord | None:
        """The record, None when there is none or it is not one (a file pvegpu did not write proves
        nothing). CreateRecordError when an earlier pvegpu's differs from it (module docstring)."""
        self._moved(node, kind, vmid)
        try:
            data = json.loads(self.path(node, kind, vmid).read_text())
            upid, sent, nonce = data["upid"], data["sent"], data.get("nonce")
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None
        if not all(value is None or isinstance(value, str) for value in (upid, nonce)):
            return None
        if not isinstance(sent, int):
            return None
        return CreateRecord(upid=upid, sent=sent, nonce=nonce)

    def write(self, node: str, kind: str, vmid: int, record: CreateRecord) -> None:
        """Write the record whole (0600, its directories 0700); LocalWriteError (an OSError) when it is not,
        CreateRecordError when an earlier pvegpu's differs from the one there."""
        self._moved(node, kind, vmid)
        _make_directories(self.directory)
        data = {"nonce": record.nonce, "sent": record.sent, "upid": record.upid}
        text = json.dumps(data, sort_keys=True) + "\n"
        write_whole(self.path(node, kind, vmid), text, _MODE)

    def forget(self, node: str, kind: str, vmid: int) -> None:
        """Remove the record (none is fine), an earlier pvegpu's of the guest with it; CreateRecordError
        when the two differ (both kept)."""
        self._moved(node, kind, vmid)
        self.path(node, kind, vmid).unlink(missing_ok=True)

    def _moved(self, node: str, kind: str, vmid: int) -> None:
        """Move an earlier pvegpu's record of the guest into `directory` (module docstring)."""
        if self.earlier is None:
            return
        old, new = self.earlier / _name(node, kind, vmid), self.path(node, kind, vmid)
        try:
            if not old.is_file():
                return
            if new.exists():
                if new.read_bytes() != old.read_bytes():
                    raise CreateRecordError(
                        f"{old} (an earlier pvegpu's record, kept without the cluster) and {new} both exist "
                        f"and differ; keep the one whose nonce is on the guest's `{NONCE_KEY}:` description "
                        "line, delete the other, then run again"
                    )
                old.unlink()  # the same bytes: a copy left by a move that was cut before the unlink
                return
            _make_directories(self.directory)
            move_unreplaced(old, new)
        except CreateRecordError:
            raise
        except OSError as error:
            raise CreateRecordError(f"{old}: not moved to {new}: {error.strerror or error}") from None


def _name(node: str, kind: str, vmid: int) -> str:
    return f"{node}-{kind}-{int(vmid)}.json"


def _make_directories(directory: Path) -> None:
    """`directory` (`guest-keys/<scope>/tasks`) and the two folders above it, each 0700 when made here
    (`mkdir`'s `parents` would give those the umask's mode)."""
    keys = directory.parent.parent
    keys.parent.mkdir(parents=True, exist_ok=True)  # the known_hosts file's own folder
    for folder in (keys, directory.parent, directory):
        folder.mkdir(mode=_DIRECTORY_MODE, exist_ok=True)


def ledger_beside(
    known_hosts: Path | str | None, api_user: str, *, cluster: str | None, owner: str | None, node: str
) -> CreateLedger | None:
    """The ledger beside `known_hosts` (a host's `ssh_known_hosts_file`, `~` expanded) of the inventory with
    `pve.cluster` `cluster` and `pve.owner` `owner`, for `node`; None without `known_hosts`."""
    if not known_hosts:
        return None
    keys = Path(known_hosts).expanduser().parent / GUEST_KEYS_DIR
    return CreateLedger(keys / key_scope(cluster, owner, node) / TASKS_DIR, api_user, keys / TASKS_DIR)
