"""pvegpu's records of the guest creates it sent, so that the next run can prove a dead create its own
(pvegpu/plan/create_proof.py).

Where: on this machine, beside the guest keys of the node's known_hosts file (pvegpu/local/guest_keys.py),
not on
the node: the API may be https (no shell on the node), and a record on the node could be written by anyone
who can create guests there. One JSON file per guest, written whole (pvegpu.local.files; 0600, in a 0700
directory):

    <dir of ssh_known_hosts_file>/guest-keys/tasks/<node>-<qemu|lxc>-<vmid>.json
        {"nonce": <32 hex digits, on the create's description line `pvegpu-create: <nonce>`>,
         "sent": <Unix seconds the POST was sent>, "upid": <the task's UPID, or null until the POST answered>}

The record is written before the POST, given the UPID once it answered, and removed once the guest is
verified whole, nothing was created, or the POST was answered with an error (no task of pvegpu's ran: the
guest there is another's, e.g. `VM 100 already exists on node 'pve1'`). A host without
`ssh_known_hosts_file` keeps no records: a dead create is then never provably pvegpu's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pvegpu.local.files import write_whole
from pvegpu.local.guest_keys import GUEST_KEYS_DIR
from pvegpu.plan.create_proof import CreateRecord

TASKS_DIR = "tasks"
_MODE = 0o600
_DIRECTORY_MODE = 0o700


@dataclass(frozen=True)
class CreateLedger:
    """The records of one node's guest creates (`directory`), and who pvegpu's create runs as there
    (`api_user`, the user in its task's UPID: `root@pam` under pvesh, and over https for a create that
    carries a key only root@pam may set, which goes through root's pvesh (`PveClient.acts_as`); else the
    API token id)."""

    directory: Path
    api_user: str

    def path(self, node: str, kind: str, vmid: int) -> Path:
        """The record of guest `vmid` of `kind` (`qemu`, `lxc`) on `node`."""
        return self.directory / f"{node}-{kind}-{int(vmid)}.json"

    def read(self, node: str, kind: str, vmid: int) -> CreateRecord | None:
        """The record, None when there is none or it is not one (a file pvegpu did not write proves
        nothing)."""
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
        """Write the record whole (0600, its directory 0700); LocalWriteError (an OSError) when it is not."""
        self.directory.mkdir(mode=_DIRECTORY_MODE, parents=True, exist_ok=True)
        data = {"nonce": record.nonce, "sent": record.sent, "upid": record.upid}
        text = json.dumps(data, sort_keys=True) + "\n"
        write_whole(self.path(node, kind, vmid), text, _MODE)

    def forget(self, node: str, kind: str, vmid: int) -> None:
        """Remove the record (none is fine)."""
        self.path(node, kind, vmid).unlink(missing_ok=True)


def ledger_beside(known_hosts: Path | str | None, api_user: str) -> CreateLedger | None:
    """The ledger beside `known_hosts` (a host's `ssh_known_hosts_file`, `~` expanded); None without one."""
    if not known_hosts:
        return None
    return CreateLedger(Path(known_hosts).expanduser().parent / GUEST_KEYS_DIR / TASKS_DIR, api_user)
