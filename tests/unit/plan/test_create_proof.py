"""`ownership`: whether a dead create task is pvegpu's, from pvegpu's record of the create it sent, the task's
UPID (Proxmox's format: `UPID:<node>:<pid>:<pstart>:<starttime hex>:<type>:<id>:<user>:`) and who pvegpu
acts as. Synthesized UPIDs; 66A1B2C4 is 1721873092 (2024-07-25 02:04:52Z)."""

from __future__ import annotations

import pytest

from pvegpu.models.pve import BackupJob, ReplicationJob, StorageVolume, TaskStatus
from pvegpu.plan.create_proof import (
    CLOCK_SKEW_S,
    CreateRecord,
    CreateVolumes,
    Ownership,
    backup_jobs_of,
    carries_nonce,
    create_storages,
    create_volumes,
    held_by,
    newest_task,
    ownership,
    start_time,
    with_nonce,
    without_nonce,
)

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


NONCE = "5eed" * 8
OLDER = "UPID:pve1:0000A1B0:0153F2C0:66A1B2C0:qmstart:100:root@pam:"
NEWER = "UPID:pve1:0000A1C9:0153F2D9:66A1B2D0:qmconfig:100:other@pve:"


def ended(upid: str) -> TaskStatus:
    return TaskStatus(upid=upid, status="stopped", exitstatus="OK")


def test_start_time_is_the_upids_hex_starttime() -> None:
    assert start_time(CREATE) == 1721873092
    assert start_time("UPID:pve1:x") is None


@pytest.mark.parametrize(
    ("tasks", "sees_all", "expected"),
    [
        pytest.param([ended(NEWER), ended(CREATE)], True, ended(NEWER), id="listed-order"),
        pytest.param([ended(CREATE), ended(NEWER), ended(OLDER)], True, ended(NEWER), id="by-start-time"),
        pytest.param(
            [ended(CREATE)],
            False,
            "the task list is not the whole of /nodes/pve1's (no Sys.Audit on /nodes/pve1: only its own "
            "tasks)",
            id="no-sys-audit",
        ),
        pytest.param([], True, "Proxmox lists no task of it", id="none"),
        pytest.param(
            [ended(CREATE), TaskStatus(OLDER, "running", None)],
            True,
            f"task {OLDER} still runs",
            id="running",
        ),
        pytest.param([ended("nonsense")], True, "'nonsense' is not a Proxmox task id", id="not-a-upid"),
    ],
)
def test_newest_task(tasks: list[TaskStatus], sees_all: bool, expected: TaskStatus | str) -> None:
    assert newest_task(tasks, sees_all, "/nodes/pve1") == expected


def test_nonce_line_is_added_and_removed_keeping_other_lines() -> None:
    assert with_nonce(None, NONCE) == f"pvegpu-create: {NONCE}"
    described = with_nonce("pvegpu-owner: lab\nnotes", NONCE)
    assert described == f"pvegpu-owner: lab\nnotes\npvegpu-create: {NONCE}"
    assert with_nonce(described, "ab" * 16) == f"pvegpu-owner: lab\nnotes\npvegpu-create: {'ab' * 16}"
    assert without_nonce({"description": described, "cores": 4}) == {
        "description": "pvegpu-owner: lab\nnotes",
        "cores": 4,
    }
    assert without_nonce({"description": f"pvegpu-create: {NONCE}\n"}) == {}
    assert without_nonce({"cores": 4}) == {"cores": 4}


@pytest.mark.parametrize(
    ("values", "record", "expected"),
    [
        pytest.param({"lock": "create", "digest": "d"}, CreateRecord(None, 1, NONCE), None, id="stub"),
        pytest.param(
            {"lock": "create", "name": "llm", "description": f"x\npvegpu-create: {NONCE}"},
            CreateRecord(None, 1, NONCE),
            Ownership(True, "its description carries pvegpu's create nonce"),
            id="ours",
        ),
        pytest.param(
            {"name": "llm"},
            CreateRecord(None, 1, NONCE),
            Ownership(False, "its config carries no `pvegpu-create:` line"),
            id="none",
        ),
        pytest.param(
            {"name": "llm", "description": f"pvegpu-create: {'ab' * 16}"},
            CreateRecord(None, 1, NONCE),
            Ownership(False, f"its `pvegpu-create:` line is not that of pvegpu's create ({'ab' * 16})"),
            id="other",
        ),
        pytest.param(
            {"name": "llm", "description": f"pvegpu-create: {NONCE}"},
            CreateRecord(None, 1, None),
            Ownership(False, f"its `pvegpu-create:` line is not that of pvegpu's create ({NONCE})"),
            id="record-without-nonce",
        ),
    ],
)
def test_carries_nonce(values: dict[str, object], record: CreateRecord, expected: Ownership | None) -> None:
    assert carries_nonce(values, record) == expected


def test_create_storages_are_those_its_disk_keys_allocate_on() -> None:
    params = {
        "scsi0": "local-lvm:200,iothread=1",
        "efidisk0": "local-lvm:1,efitype=4m",
        "ide2": "cephpool:cloudinit",
        "ide0": "local:iso/debian.iso,media=cdrom",  # an existing volume: nothing allocated
        "scsi1": "local-lvm:vm-100-disk-3",
        "virtio1": "file=zfs.1:0.5",
        "net0": "virtio,bridge=vmbr0",
    }
    assert create_storages(params) == ("cephpool", "local-lvm", "zfs.1")


def test_create_volumes_are_those_of_its_vmid_since_the_record_less_the_skew() -> None:
    record = CreateRecord(None, 1000)
    volumes = [
        StorageVolume("s:vm-100-disk-0", 100, 1000 - CLOCK_SKEW_S),  # the node's clock 60 s behind
        StorageVolume("s:vm-100-disk-1", 100, 1000 - CLOCK_SKEW_S - 1),
        StorageVolume("s:vm-100-disk-2", 100, None),  # no ctime: proves nothing
        StorageVolume("s:vm-101-disk-0", 101, 2000),
    ]
    assert create_volumes(volumes, 100, record) == CreateVolumes(
        ours=("s:vm-100-disk-0",), older=("s:vm-100-disk-1", "s:vm-100-disk-2")
    )


@pytest.mark.parametrize(
    ("sids", "jobs", "held"),
    [
        pytest.param((), (), None, id="nothing"),
        pytest.param(("vm:101", "ct:100"), (ReplicationJob("101-0", 101),), None, id="other-guests"),
        pytest.param(("vm:100",), (), "it is HA resource vm:100", id="ha"),
        pytest.param(
            (), (ReplicationJob("100-0", 100),), "replication job 100-0 replicates it", id="one-job"
        ),
        pytest.param(
            ("vm:100",),
            (ReplicationJob("100-1", 100), ReplicationJob("100-0", 100)),
            "it is HA resource vm:100 and replication jobs 100-0, 100-1 replicate it",
            id="both",
        ),
    ],
)
def test_held_by(sids: tuple[str, ...], jobs: tuple[ReplicationJob, ...], held: str | None) -> None:
    assert held_by(sids, jobs, "vm:100", 100) == held


def test_backup_jobs_of_as_vzdump_selects_guests() -> None:
    """PVE::VZDump get_included_guests: `pool` first, else the `vmid` list, else `all` but `exclude`; a job
    limited to another node leaves the guest out."""
    jobs = (
        BackupJob("listed", vmids=(101, 100)),
        BackupJob("not-listed", vmids=(101,), all=True),  # a vmid list wins over `all`
        BackupJob("all", all=True, exclude=(101,)),
        BackupJob("excluded", all=True, exclude=(100,)),
        BackupJob("elsewhere", vmids=(100,), node="pve2"),
        BackupJob("here", vmids=(100,), node="pve1", enabled=False),
        BackupJob("pool", pool="gpu", vmids=(101,)),  # a pool wins over the vmid list
        BackupJob("none"),  # neither: no guest
    )

    assert backup_jobs_of(jobs, 100, "pve1") == (
        "listed (vmid list)",
        "all (all guests)",
        "here (vmid list, disabled)",
        "pool (pool gpu, if the pool holds it)",
    )
