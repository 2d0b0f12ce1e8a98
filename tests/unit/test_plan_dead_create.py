"""`ownership`: whether a dead create task is pvegpu's, from pvegpu's record of the create it sent, the task's
UPID (Proxmox's format: `UPID:<node>:<pid>:<pstart>:<starttime hex>:<type>:<id>:<user>:`) and who pvegpu
acts as. Synthesized UPIDs; 66A1B2C4 is 1721873092 (2024-07-25 02:04:52Z)."""

from __future__ import annotations

import pytest

from pvegpu.plan.dead_create import CreateRecord, Ownership, ownership

CREATE = "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:qmcreate:100:root@pam:"
STARTED = 0x66A1B2C4
TOKEN_CREATE = "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:qmcreate:100:pvegpu@pve!deploy:"


@pytest.mark.parametrize(
    ("record", "upid", "user", "expected"),
    [
        pytest.param(
            CreateRecord(CREATE, STARTED - 300),
            CREATE,
            "root@pam",
            Ownership(True, "pvegpu recorded its task id when the POST answered"),
            id="same-upid",
        ),
        pytest.param(
            CreateRecord(None, STARTED - 2),
            CREATE,
            "root@pam",
            Ownership(True, "it started as root@pam within 60 s of pvegpu's POST, which never answered"),
            id="unanswered-post",
        ),
        pytest.param(
            CreateRecord(None, STARTED + 30),
            TOKEN_CREATE,
            "pvegpu@pve!deploy",
            Ownership(
                True, "it started as pvegpu@pve!deploy within 60 s of pvegpu's POST, which never answered"
            ),
            id="unanswered-post-token-clock-behind",
        ),
        pytest.param(
            None,
            CREATE,
            "root@pam",
            Ownership(False, "pvegpu has no record of creating it"),
            id="no-record",
        ),
        pytest.param(
            CreateRecord("UPID:pve1:0000B000:0153F2C4:66A1B000:qmcreate:100:root@pam:", STARTED),
            CREATE,
            "root@pam",
            Ownership(
                False, "pvegpu's create was task UPID:pve1:0000B000:0153F2C4:66A1B000:qmcreate:100:root@pam:"
            ),
            id="other-upid",
        ),
        pytest.param(
            CreateRecord(None, STARTED),
            CREATE,
            "pvegpu@pve!deploy",
            Ownership(False, "the task ran as root@pam, pvegpu acts as pvegpu@pve!deploy"),
            id="other-user",
        ),
        pytest.param(
            CreateRecord(None, STARTED + 61),
            CREATE,
            "root@pam",
            Ownership(
                False,
                "the task started at 2024-07-25 02:04:52Z, not when pvegpu sent its create "
                "(2024-07-25 02:05:53Z)",
            ),
            id="older-task",
        ),
        pytest.param(
            CreateRecord(None, STARTED - 3600),
            CREATE,
            "root@pam",
            Ownership(
                False,
                "the task started at 2024-07-25 02:04:52Z, not when pvegpu sent its create "
                "(2024-07-25 01:04:52Z)",
            ),
            id="much-later-task",
        ),
        pytest.param(
            CreateRecord(None, STARTED),
            "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:qmstart:100:root@pam:",
            "root@pam",
            Ownership(False, "its last task is a qmstart of 100, not a create"),
            id="not-a-create",
        ),
        pytest.param(
            CreateRecord(None, STARTED),
            "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:qmcreate:101:root@pam:",
            "root@pam",
            Ownership(False, "its last task is a qmcreate of 101, not a create"),
            id="other-vmid",
        ),
        pytest.param(
            CreateRecord(None, STARTED),
            "not-a-upid",
            "root@pam",
            Ownership(False, "'not-a-upid' is not a Proxmox task id"),
            id="garbage",
        ),
    ],
)
def test_ownership(record: CreateRecord | None, upid: str, user: str, expected: Ownership) -> None:
    assert ownership(record, upid, "qmcreate", 100, user) == expected


def test_ownership_of_a_container_create_needs_vzcreate() -> None:
    vzcreate = "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:vzcreate:200:root@pam:"
    record = CreateRecord(None, STARTED)
    assert ownership(record, vzcreate, "vzcreate", 200, "root@pam").own
    assert ownership(record, vzcreate, "qmcreate", 200, "root@pam") == Ownership(
        False, "its last task is a vzcreate of 200, not a create"
    )
