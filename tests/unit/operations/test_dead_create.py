"""`converge` (through `q35_vm`, `lxc_container`) and what a dead create left: pvegpu's own (its record,
pvegpu/local/create_records.py) is unlocked, destroyed and created again in the same run; anything else is
reported with its task and the exact command, untouched. And the record's life in `_create`: written before
the POST, given the UPID, removed once the guest is whole."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.local.create_records import CreateLedger, ledger_beside
from pvegpu.models.pve_root_only import root_only_params
from pvegpu.operations.lxc import lxc_container
from pvegpu.operations.pve_guest import CT, Guest
from pvegpu.plan.create_proof import CreateRecord
from pvegpu.pve.errors import PveError
from pvegpu.pve.transport import Params
from tests.unit.fake_pve import NONCED, UPID_CREATE, ConfigStore, FakeApi, execute, sequence, task_ok
from tests.unit.op_harness import run_op
from tests.unit.operations.test_lxc import PLAN as CT_PLAN
from tests.unit.operations.test_vm import (
    CONFIG,
    CONFIG_PATH,
    CREATE,
    DEAD_CREATE,
    STUB,
    TASKS,
    converge,
    created_config,
    vm_store,
)

STARTED = 0x66A1B2C4  # UPID_CREATE's start time
UPID_DESTROY = "UPID:pve1:0000A1C0:0153F2D0:66A1B3C4:qmdestroy:100:root@pam:"
UPID_AGAIN = "UPID:pve1:0000A1C1:0153F2D1:66A1B3C5:qmcreate:100:root@pam:"
WARNING = (
    f"[pve1] VM 100 is locked (create) by pvegpu's create task {UPID_CREATE}, which no longer runs (exit "
    "status: unexpected status; it started as root@pam within 60 s of pvegpu's POST, which never "
    "answered): removing the lock, destroying what it left and creating it again"
)
REPORT = (
    f"VM 100 is locked (create); its last task {UPID_CREATE} no longer runs (exit status: unexpected "
    "status): check VM 100 on pve1, remove the lock with `qm unlock 100` there, then run again"
)


def ledger(tmp_path: Path, user: str = "root@pam", record: CreateRecord | None = None) -> CreateLedger:
    made = ledger_beside(tmp_path / "known_hosts", user, cluster=None, owner=None, node="pve1")
    assert made is not None
    if record is not None:
        made.write("pve1", "qemu", 100, record)
    return made


AUDITOR = {"/nodes/pve1": {"Sys.Audit": 1, "Sys.Modify": 1}}  # GET /access/permissions: every task seen
NONCE_LINE = "pvegpu-create: " + "5eed" * 8


CONTENT = "/nodes/pve1/storage/local-lvm/content"  # the create's disks are on local-lvm (SPEC)
UPID_IMGDEL = "UPID:pve1:0000A1C2:0153F2D2:66A1B3C6:imgdel:100@local-lvm:root@pam:"


def volume(name: str, ctime: int, vmid: int = 100) -> dict[str, object]:
    """A content listing's entry (pve-storage API2/Storage/Content.pm index) of a local-lvm volume."""
    return {"volid": f"local-lvm:{name}", "vmid": vmid, "ctime": ctime, "format": "raw", "size": 1 << 30}


def dead_create_api(
    store: ConfigStore, user: str = "root@pam", volumes: list[dict[str, object]] | None = None
) -> FakeApi:
    """The API over a dead create's leftover `store` and local-lvm's `volumes` (the destroy frees none:
    the stub config names none; DELETE …/content/<volid> frees one)."""
    listed = list(volumes or [])

    def destroy(_params: dict[str, Any]) -> str:
        store.values = None
        return UPID_DESTROY

    def freed(volid: object) -> Any:
        def answer(_params: dict[str, Any]) -> str:
            listed[:] = [item for item in listed if item["volid"] != volid]
            return UPID_IMGDEL

        return answer

    return FakeApi(
        {
            ("GET", CONTENT): lambda _params: list(listed),
            **{("DELETE", f"{CONTENT}/{item['volid']}"): freed(item["volid"]) for item in listed},
            ("GET", f"/nodes/pve1/tasks/{UPID_IMGDEL}/status"): task_ok(UPID_IMGDEL),
            ("GET", "/access/permissions"): AUDITOR,
            ("GET", "/cluster/ha/resources"): [],
            ("GET", "/cluster/replication"): [],
            ("GET", "/cluster/backup"): [],
            ("GET", CONFIG_PATH): store.get,
            ("PUT", CONFIG_PATH): store.put,
            ("GET", TASKS): [DEAD_CREATE],
            ("DELETE", "/nodes/pve1/qemu/100"): destroy,
            ("GET", f"/nodes/pve1/tasks/{UPID_DESTROY}/status"): task_ok(UPID_DESTROY),
            ("POST", "/nodes/pve1/qemu"): store.create(created_config(), UPID_AGAIN),
            ("GET", f"/nodes/pve1/tasks/{UPID_AGAIN}/status"): task_ok(UPID_AGAIN),
        },
        user,
    )


def test_drift_own_dead_create_is_unlocked_destroyed_and_created_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = ledger(tmp_path, record=CreateRecord(None, STARTED - 1))
    api = dead_create_api(vm_store({**STUB}))

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        commands, noops = converge(api, records)
    execute(commands)

    assert noops == []
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [WARNING]
    assert api.writes() == [
        ("PUT", CONFIG_PATH, {"delete": "lock", "skiplock": True, "digest": "5tub"}),
        ("DELETE", "/nodes/pve1/qemu/100", {}),  # no purge, no destroy-unreferenced-disks
        ("POST", "/nodes/pve1/qemu", {"vmid": 100, **CONFIG, **CREATE, **NONCED}),
    ]
    assert not records.path("pve1", "qemu", 100).exists()  # whole: the record is gone


def test_drift_own_dead_create_frees_its_volumes_and_leaves_an_older_one_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The killed create allocated disk-1 (after its POST: ctime within the slack); disk-0 of vmid 100 is
    an hour older than the record (another's, or a leftover of before): left and named, never freed."""
    records = ledger(tmp_path, record=CreateRecord(None, STARTED - 1))
    older, ours = volume("vm-100-disk-0", STARTED - 3600), volume("vm-100-disk-1", STARTED + 2)
    api = dead_create_api(vm_store({**STUB}), volumes=[older, ours, volume("vm-101-disk-0", STARTED, 101)])

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        commands, _ = converge(api, records)
        execute(commands)

    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        WARNING,
        "[pve1] VM 100: left local-lvm:vm-100-disk-0: older than pvegpu's create (sent 2024-07-25 "
        "02:04:51Z), not provably its own",
    ]
    assert [call[:2] for call in api.writes()] == [
        ("PUT", CONFIG_PATH),
        ("DELETE", "/nodes/pve1/qemu/100"),
        ("DELETE", f"{CONTENT}/local-lvm:vm-100-disk-1"),
        ("POST", "/nodes/pve1/qemu"),
    ]
    assert ("GET", CONTENT, {"vmid": 100}) in api.calls


HA_REFUSAL = PveError(500, "unable to remove VM 100 - used in HA resources and purge parameter not set.")


def test_error_own_dead_create_in_ha_is_one_line_and_nothing_destroyed(tmp_path: Path) -> None:
    """Without `purge` Proxmox refuses a VM that is an HA resource (API2/Qemu.pm destroy_vm's early check,
    before any task): should one be added after pvegpu's last read of the HA resources, Proxmox's refusal is
    one line naming the VM and what holds it; no volume freed, no create sent."""
    records = ledger(tmp_path, record=CreateRecord(None, STARTED - 1))
    api = dead_create_api(vm_store({**STUB}), volumes=[volume("vm-100-disk-1", STARTED + 2)])
    api.answers[("DELETE", "/nodes/pve1/qemu/100")] = HA_REFUSAL

    commands, _ = converge(api, records)
    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 on pve1 not destroyed, it is an HA resource: DELETE /nodes/pve1/qemu/100: unable to remove "
        "VM 100 - used in HA resources and purge parameter not set; pvegpu purges no HA or "
        "replication entry (its create lock removed, nothing destroyed): remove it from there, then run again"
    )
    assert [call[:2] for call in api.writes()] == [("PUT", CONFIG_PATH), ("DELETE", "/nodes/pve1/qemu/100")]


def test_error_own_dead_create_with_a_replication_job_is_one_line(tmp_path: Path) -> None:
    """pve-guest-common ReplicationConfig.pm check_for_existing_jobs, without `purge`."""
    records = ledger(tmp_path, record=CreateRecord(None, STARTED - 1))
    api = dead_create_api(vm_store({**STUB}))
    api.answers[("DELETE", "/nodes/pve1/qemu/100")] = PveError(
        500, "There is a replication job '100-0' for guest '100' - Please remove that first."
    )

    commands, _ = converge(api, records)
    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 on pve1 not destroyed, replication job 100-0 replicates it: DELETE /nodes/pve1/qemu/100: "
        "There is a replication job '100-0' for guest '100' - Please remove that first; pvegpu purges no HA "
        "or replication entry (its create lock removed, nothing destroyed): remove it from there, then run "
        "again"
    )


def test_drift_own_dead_create_a_token_with_a_root_path_unlocks_through_root(tmp_path: Path) -> None:
    """https with pve.root_ssh: the create of a VM with a hookscript ran as root@pam (its UPID's user), and
    the unlock (`skiplock`) goes through root's pvesh too (pvegpu.pve RootRouted)."""

    class RoutedApi(FakeApi):
        def acts_as(self, method: str, path: str, params: Params) -> str:
            return "root@pam" if root_only_params(method, path, params) else "pvegpu@pve!deploy"

    store = vm_store({**STUB})
    records = ledger(tmp_path, "root@pam", CreateRecord(None, STARTED - 1))
    api = RoutedApi(dead_create_api(store).answers, "pvegpu@pve!deploy")

    commands, _ = converge(api, records)
    execute(commands)

    assert [call[:2] for call in api.writes()] == [
        ("PUT", CONFIG_PATH),
        ("DELETE", "/nodes/pve1/qemu/100"),
        ("POST", "/nodes/pve1/qemu"),
    ]


def test_drift_own_half_made_vm_is_destroyed_and_created_again_without_unlocking(tmp_path: Path) -> None:
    records = ledger(tmp_path, record=CreateRecord(UPID_CREATE, STARTED))
    api = dead_create_api(vm_store({"digest": "e1"}))  # what `qm unlock` leaves of a killed create

    commands, _ = converge(api, records)
    execute(commands)

    assert [call[:2] for call in api.writes()] == [
        ("DELETE", "/nodes/pve1/qemu/100"),
        ("POST", "/nodes/pve1/qemu"),
    ]


@pytest.mark.parametrize(
    ("user", "record", "info"),
    [
        pytest.param("root@pam", None, "pvegpu has no record of creating it", id="no-record"),
        pytest.param(
            "root@pam",
            CreateRecord(None, STARTED + 3600),
            "the task started at 2024-07-25 02:04:52Z, not when pvegpu sent its create "
            "(2024-07-25 03:04:52Z)",
            id="older-task",
        ),
        pytest.param(
            "pvegpu@pve!deploy",
            CreateRecord(None, STARTED),
            "the task ran as root@pam, pvegpu acts as pvegpu@pve!deploy",
            id="other-user",
        ),
    ],
)
def test_error_dead_create_not_provably_pvegpus_is_reported_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, user: str, record: CreateRecord | None, info: str
) -> None:
    api = dead_create_api(vm_store({**STUB}))

    with caplog.at_level(logging.INFO, logger="pyinfra"), pytest.raises(OperationError) as error:
        converge(api, ledger(tmp_path, user, record))

    assert str(error.value) == REPORT
    assert f"[pve1] VM 100: the dead create {UPID_CREATE} is not provably pvegpu's: {info}" in [
        r.getMessage() for r in caplog.records
    ]
    assert api.writes() == []


def test_error_own_dead_create_locked_but_pvegpu_is_not_root_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = "pvegpu@pve!deploy"  # the https backend with pve.root_ssh: false
    api = dead_create_api(vm_store({**STUB}), token)
    records = ledger(tmp_path, token, CreateRecord(UPID_CREATE, STARTED))

    with caplog.at_level(logging.INFO, logger="pyinfra"), pytest.raises(OperationError) as error:
        converge(api, records)

    assert str(error.value) == REPORT
    assert (
        f"[pve1] VM 100: the dead create {UPID_CREATE} is pvegpu's (pvegpu recorded its task id when the "
        f"POST answered), but only root@pam may remove a lock through the API and pvegpu acts as {token}"
    ) in [r.getMessage() for r in caplog.records]
    assert api.writes() == []


def test_error_dead_create_still_running_is_reported(tmp_path: Path) -> None:
    running = {key: value for key, value in DEAD_CREATE.items() if key not in ("status", "endtime")}
    api = FakeApi({("GET", CONFIG_PATH): STUB, ("GET", TASKS): [running]})

    with pytest.raises(OperationError) as error:
        converge(api, ledger(tmp_path, record=CreateRecord(UPID_CREATE, STARTED)))

    assert str(error.value) == (
        f"VM 100 is locked (create) by task {UPID_CREATE}, which still runs: run again when it has ended"
    )
    assert api.writes() == []


def test_error_own_dead_create_of_a_container_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upid = "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:vzcreate:200:root@pam:"
    task = {**DEAD_CREATE, "upid": upid, "type": "vzcreate", "id": "200"}
    records = ledger(tmp_path)
    records.write("pve1", "lxc", 200, CreateRecord(upid, STARTED))
    api = FakeApi(
        {
            ("GET", "/nodes/pve1/lxc/200/config"): STUB,
            ("GET", TASKS): [task],
            ("GET", "/access/permissions"): AUDITOR,
        }
    )

    with caplog.at_level(logging.INFO, logger="pyinfra"), pytest.raises(OperationError) as error:
        run_op(
            lxc_container,
            {},
            guest=Guest(CT, api.client, "pve1", 200),
            container=replace(CT_PLAN, config={}, create={}),
            timeout_s=5,
            ledger=records,
        )

    assert str(error.value) == (
        f"CT 200 is locked (create); its last task {upid} no longer runs (exit status: unexpected status): "
        "check CT 200 on pve1, remove the lock with `pct unlock 200` there, then run again"
    )
    assert (
        f"[pve1] CT 200: the dead create {upid} is pvegpu's (pvegpu recorded its task id when the POST "
        "answered), but pvegpu does not destroy a container"
    ) in [r.getMessage() for r in caplog.records]
    assert api.writes() == []


def test_create_records_the_upid_before_waiting_and_keeps_the_record_of_a_killed_create(
    tmp_path: Path,
) -> None:
    records = ledger(tmp_path)
    store = vm_store(None)
    seen: list[CreateRecord | None] = []

    def task_status(_params: dict[str, Any]) -> dict[str, object]:
        seen.append(records.read("pve1", "qemu", 100))
        return {"upid": UPID_CREATE, "status": "stopped", "exitstatus": "unexpected status"}

    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("POST", "/nodes/pve1/qemu"): store.create(STUB, UPID_CREATE),
            ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status"): task_status,
            ("GET", TASKS): [DEAD_CREATE],
        }
    )
    commands, _ = converge(api, records)

    with pytest.raises(OperationError) as error:
        execute(commands)

    # The record proves the leftover pvegpu's: the next run repairs it, no `qm unlock` by hand.
    assert str(error.value) == (
        f"VM 100 not completely created after task {UPID_CREATE}: unexpected status: VM 100 is locked "
        f"(create); its last task {UPID_CREATE} no longer runs (exit status: unexpected status): nothing "
        "after it was written; run again (it destroys what the create left and creates it)"
    )
    [during] = seen
    assert during is not None
    assert during.upid == UPID_CREATE
    assert records.read("pve1", "qemu", 100) == during  # not whole: kept for the next run
    assert oct(records.path("pve1", "qemu", 100).stat().st_mode & 0o777) == "0o600"


def test_create_refused_before_anything_was_made_forgets_the_record(tmp_path: Path) -> None:
    records = ledger(tmp_path)
    store = vm_store(None)
    refused = PveError(500, "unable to create VM 100 - no space left")
    api = FakeApi(
        {("GET", CONFIG_PATH): store.get, ("POST", "/nodes/pve1/qemu"): refused, ("GET", TASKS): []}
    )
    commands, _ = converge(api, records)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert (
        str(error.value)
        == "VM 100 not created: POST /nodes/pve1/qemu: unable to create VM 100 - no space left"
    )
    assert not records.path("pve1", "qemu", 100).exists()


def test_no_known_hosts_file_keeps_no_records() -> None:
    assert ledger_beside(None, "root@pam", cluster="lab", owner=None, node="pve1") is None
    assert ledger_beside("~/kh", "root@pam", cluster="lab", owner=None, node="pve1") == CreateLedger(
        Path.home() / "guest-keys/lab/tasks", "root@pam", Path.home() / "guest-keys/tasks"
    )


# --- the proof cannot misfire (issue 24 point 2) ---------------------------------------------------------


def test_error_create_answered_with_an_error_drops_the_record_and_leaves_the_guest(tmp_path: Path) -> None:
    """Another operator's concurrent create holds VM 100: Proxmox answers the POST (API2/Qemu.pm
    create_vm, pve-cluster check_vmid_unused) and no task of pvegpu's ran, so its record goes; what is
    there is not looked at, nothing is written."""
    records = ledger(tmp_path)
    store = vm_store({**STUB})
    taken = PveError(500, "unable to create VM 100 - VM 100 already exists on node 'pve1'")

    def post(_params: dict[str, Any]) -> str:
        assert records.read("pve1", "qemu", 100) == CreateRecord(None, records_sent(records), "5eed" * 8)
        raise taken

    theirs = {
        **{key: value for key, value in DEAD_CREATE.items() if key not in ("status", "endtime")},
        "upid": "UPID:pve1:0000B000:0153F300:66A1B2C4:qmcreate:100:other@pve:",
        "user": "other@pve",
    }
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): vm_store(None).get,
            ("POST", "/nodes/pve1/qemu"): post,
            ("GET", TASKS): [theirs],  # it still runs
        }
    )
    commands, _ = converge(api, records)
    api.answers[("GET", CONFIG_PATH)] = store.get  # created by the other operator meanwhile

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 not created: POST /nodes/pve1/qemu: unable to create VM 100 - VM 100 already exists on node "
        "'pve1'"
    )
    assert not records.path("pve1", "qemu", 100).exists()
    assert [call[:2] for call in api.writes()] == [("POST", "/nodes/pve1/qemu")]
    assert store.values == STUB


def records_sent(records: CreateLedger) -> int:
    record = records.read("pve1", "qemu", 100)
    assert record is not None
    return record.sent


FOREIGN = {**created_config(), "lock": "create", "digest": "f0"}  # a whole config, still locked


@pytest.mark.parametrize(
    ("description", "info"),
    [
        pytest.param(None, "its config carries no `pvegpu-create:` line", id="no-nonce"),
        pytest.param(
            "pvegpu-owner: lab\npvegpu-create: " + "ab" * 16,
            f"its `pvegpu-create:` line is not that of pvegpu's create ({'ab' * 16})",
            id="other-nonce",
        ),
    ],
)
def test_error_foreign_leftover_without_the_records_nonce_is_reported_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, description: str | None, info: str
) -> None:
    values = FOREIGN if description is None else {**FOREIGN, "description": description}
    api = dead_create_api(vm_store(values))
    records = ledger(tmp_path, record=CreateRecord(UPID_CREATE, STARTED, "5eed" * 8))

    with caplog.at_level(logging.INFO, logger="pyinfra"), pytest.raises(OperationError) as error:
        converge(api, records)

    assert str(error.value) == REPORT
    assert f"[pve1] VM 100: the dead create {UPID_CREATE} is not provably pvegpu's: {info}" in [
        r.getMessage() for r in caplog.records
    ]
    assert api.writes() == []


def test_drift_own_leftover_with_the_records_nonce_is_destroyed_and_created_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api = dead_create_api(vm_store({**FOREIGN, "description": f"pvegpu-owner: lab\n{NONCE_LINE}"}))
    records = ledger(tmp_path, record=CreateRecord(UPID_CREATE, STARTED, "5eed" * 8))

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        commands, _ = converge(api, records)
    execute(commands)

    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"[pve1] VM 100 is locked (create) by pvegpu's create task {UPID_CREATE}, which no longer runs (exit "
        "status: unexpected status; pvegpu recorded its task id when the POST answered; its description "
        "carries pvegpu's create nonce): removing the lock, destroying what it left and creating it again"
    ]
    assert [call[:2] for call in api.writes()] == [
        ("PUT", CONFIG_PATH),
        ("DELETE", "/nodes/pve1/qemu/100"),
        ("POST", "/nodes/pve1/qemu"),
    ]


def test_error_shared_token_without_sys_audit_cannot_prove_a_dead_create(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without Sys.Audit on /nodes/pve1 Proxmox lists only the identity's own tasks (pve-manager
    API2/Tasks.pm): another operator's newer task on the same VM would be missing, so nothing is proven."""
    token = "pvegpu@pve!deploy"
    api = dead_create_api(vm_store({**STUB}), token)
    api.answers[("GET", "/access/permissions")] = {"/nodes/pve1": {"VM.Allocate": 1}}
    records = ledger(tmp_path, token, CreateRecord(None, STARTED))

    with caplog.at_level(logging.INFO, logger="pyinfra"), pytest.raises(OperationError) as error:
        converge(api, records)

    assert str(error.value) == REPORT
    assert (
        "[pve1] VM 100: the dead create is not provably pvegpu's: the task list is not the whole of "
        "/nodes/pve1's (no Sys.Audit on /nodes/pve1: only its own tasks)"
    ) in [r.getMessage() for r in caplog.records]
    assert api.writes() == []


UPID_NEWER = "UPID:pve1:0000A1C9:0153F2D9:66A1B2D0:qmconfig:100:other@pve:"


@pytest.mark.parametrize(
    ("newer", "info"),
    [
        pytest.param(
            {**DEAD_CREATE, "upid": UPID_NEWER, "type": "qmconfig", "status": "OK"},
            "the dead create UPID:pve1:0000A1C9:0153F2D9:66A1B2D0:qmconfig:100:other@pve: is not provably "
            "pvegpu's: its last task is a qmconfig of 100, not a create",
            id="newer",
        ),
        pytest.param(
            {key: value for key, value in DEAD_CREATE.items() if key not in ("status", "endtime")}
            | {"upid": UPID_NEWER, "type": "qmconfig"},
            f"the dead create is not provably pvegpu's: task {UPID_NEWER} still runs",
            id="running",
        ),
    ],
)
def test_error_a_newer_or_running_task_refuses_the_proof(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, newer: dict[str, object], info: str
) -> None:
    """Listed after the create (Proxmox's order is not trusted): by UPID start time it is newer."""
    api = dead_create_api(vm_store({**STUB}))
    api.answers[("GET", TASKS)] = [DEAD_CREATE, newer]
    records = ledger(tmp_path, record=CreateRecord(UPID_CREATE, STARTED))

    with caplog.at_level(logging.INFO, logger="pyinfra"), pytest.raises(OperationError):
        converge(api, records)

    assert f"[pve1] VM 100: {info}" in [r.getMessage() for r in caplog.records]
    assert api.writes() == []


def test_error_digest_changed_between_plan_and_execution_refuses_the_unlock(tmp_path: Path) -> None:
    store = vm_store({**STUB})
    api = dead_create_api(store)
    commands, _ = converge(api, ledger(tmp_path, record=CreateRecord(UPID_CREATE, STARTED)))
    store.values = {**STUB, "digest": "0ther"}  # someone wrote its config meanwhile

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 changed since pvegpu judged it its own dead create (digest 5tub, now digest 0ther): nothing "
        "unlocked or destroyed; run again"
    )
    assert api.writes() == []


def test_error_task_started_between_plan_and_execution_refuses_the_unlock(tmp_path: Path) -> None:
    api = dead_create_api(vm_store({**STUB}))
    commands, _ = converge(api, ledger(tmp_path, record=CreateRecord(UPID_CREATE, STARTED)))
    api.answers[("GET", TASKS)] = [{**DEAD_CREATE, "upid": UPID_NEWER, "type": "qmconfig"}, DEAD_CREATE]

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        f"VM 100 has a task since pvegpu judged {UPID_CREATE} its own dead create (its newest task is "
        f"{UPID_NEWER}): nothing unlocked or destroyed; run again"
    )
    assert api.writes() == []


def test_create_removes_its_nonce_line_once_the_guest_is_whole(tmp_path: Path) -> None:
    """The nonce only proves a dead create's leftovers: a whole guest keeps its other description lines."""
    records = ledger(tmp_path)
    store = vm_store(None)
    upid = UPID_CREATE
    made = {**created_config(), "description": f"pvegpu-owner: lab\n{NONCE_LINE}", "digest": "c1"}
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("PUT", CONFIG_PATH): store.put,
            ("POST", "/nodes/pve1/qemu"): store.create(made, upid),
            ("GET", f"/nodes/pve1/tasks/{upid}/status"): task_ok(upid),
        }
    )
    commands, _ = converge(api, records)
    execute(commands)

    assert api.writes()[1] == ("PUT", CONFIG_PATH, {"description": "pvegpu-owner: lab", "digest": "c1"})
    assert store.values is not None
    assert store.values["description"] == "pvegpu-owner: lab"
    assert not records.path("pve1", "qemu", 100).exists()


def test_error_create_answered_with_an_error_after_its_task_began_keeps_the_record(tmp_path: Path) -> None:
    """pvesh runs the task inside the call: exiting with an error (its worker killed) after the task
    began, the create may have left something: the record stays and what is there is read back."""
    records = ledger(tmp_path)
    store = vm_store(None)
    crashed = PveError(500, "OSError: [Errno 27] File too large")

    def post(_params: dict[str, Any]) -> str:
        store.values = {**STUB}
        ours = {**DEAD_CREATE, "upid": UPID_CREATE.replace("66A1B2C4", f"{records_sent(records):08X}")}
        api.answers[("GET", TASKS)] = [ours]
        raise crashed

    api = FakeApi({("GET", CONFIG_PATH): store.get, ("POST", "/nodes/pve1/qemu"): post})
    commands, _ = converge(api, records)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value).startswith(
        "VM 100 not completely created after POST /nodes/pve1/qemu: OSError: [Errno 27] File too large: "
        "VM 100 is locked (create)"
    )
    record = records.read("pve1", "qemu", 100)
    assert record is not None
    assert record.upid is None


def test_record_keeps_its_nonce_and_an_older_record_reads_without_one(tmp_path: Path) -> None:
    records = ledger(tmp_path, record=CreateRecord(None, STARTED, "5eed" * 8))
    path = records.path("pve1", "qemu", 100)

    assert path.read_text() == f'{{"nonce": "{"5eed" * 8}", "sent": {STARTED}, "upid": null}}\n'
    assert records.read("pve1", "qemu", 100) == CreateRecord(None, STARTED, "5eed" * 8)
    path.write_text(f'{{"sent": {STARTED}, "upid": null}}\n')
    assert records.read("pve1", "qemu", 100) == CreateRecord(None, STARTED, None)
    path.write_text(f'{{"nonce": 5, "sent": {STARTED}, "upid": null}}\n')
    assert records.read("pve1", "qemu", 100) is None


# --- what holds the leftover: HA, replication, backup jobs (issue 24 point 2) -----------------------------

HA_VM_100 = {"sid": "vm:100", "type": "vm", "state": "started", "digest": "a1" * 20}  # Resources.pm index
REPLICATION = {
    "id": "100-0",
    "guest": 100,
    "jobnum": 0,
    "type": "local",
    "target": "pve2",
    "schedule": "*/15",
}
HELD = (
    "VM 100 on pve1 not destroyed, {}; pvegpu purges no HA or replication entry (nothing unlocked or "
    "destroyed): remove it from there, then run again"
)


@pytest.mark.parametrize(
    ("ha", "replication", "held"),
    [
        pytest.param([HA_VM_100], [], "it is HA resource vm:100", id="ha"),
        pytest.param(
            [{**HA_VM_100, "sid": "ct:100", "type": "ct"}, {**HA_VM_100, "sid": "vm:101"}],
            [REPLICATION, {**REPLICATION, "id": "101-0", "guest": 101}],
            "replication job 100-0 replicates it",
            id="replication",
        ),
        pytest.param(
            [HA_VM_100],
            [REPLICATION, {**REPLICATION, "id": "100-1", "jobnum": 1, "target": "pve3"}],
            "it is HA resource vm:100 and replication jobs 100-0, 100-1 replicate it",
            id="both",
        ),
    ],
)
def test_error_own_dead_create_held_by_ha_or_replication_is_refused_before_anything_is_unlocked(
    tmp_path: Path, ha: list[dict[str, object]], replication: list[dict[str, object]], held: str
) -> None:
    """Proxmox refuses to destroy it without `purge`, which pvegpu never sends: read before anything is
    written, so nothing is unlocked (it would be left unlocked by a refused destroy)."""
    api = dead_create_api(vm_store({**STUB}), volumes=[volume("vm-100-disk-1", STARTED + 2)])
    api.answers[("GET", "/cluster/ha/resources")] = ha
    api.answers[("GET", "/cluster/replication")] = replication

    with pytest.raises(OperationError) as error:
        converge(api, ledger(tmp_path, record=CreateRecord(None, STARTED - 1)))

    assert str(error.value) == HELD.format(held)
    assert api.writes() == []


def test_error_ha_resource_added_after_planning_is_refused_before_the_unlock(tmp_path: Path) -> None:
    """Decided again right before the unlock: an HA resource added since the run was planned refuses it."""
    api = dead_create_api(vm_store({**STUB}))
    api.answers[("GET", "/cluster/ha/resources")] = sequence([], [HA_VM_100])

    commands, _ = converge(api, ledger(tmp_path, record=CreateRecord(None, STARTED - 1)))
    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == HELD.format("it is HA resource vm:100")
    assert api.writes() == []


def test_error_ha_resources_not_readable_refuses_the_destroy(tmp_path: Path) -> None:
    """pve-ha-manager API2/HA/Resources.pm `index` needs Sys.Audit on `/`: a token without it cannot tell,
    so the half-made VM its own create left (proven by the recorded UPID) is not destroyed."""
    api = dead_create_api(vm_store({"digest": "e1"}), "pvegpu@pve!deploy")
    api.answers[("GET", "/cluster/ha/resources")] = PveError(403, "Permission check failed (/, Sys.Audit)")
    records = ledger(tmp_path, "pvegpu@pve!deploy", CreateRecord(UPID_CREATE, STARTED))

    with pytest.raises(OperationError) as error:
        converge(api, records)

    assert str(error.value) == (
        "VM 100 on pve1 not destroyed: whether HA or a replication job holds it is unknown (GET "
        "/cluster/ha/resources: Permission check failed (/, Sys.Audit)); nothing unlocked or destroyed, run "
        "again"
    )
    assert api.writes() == []


BACKUP = {"type": "vzdump", "enabled": 1, "schedule": "21:00", "storage": "local", "mode": "snapshot"}


@pytest.mark.parametrize(
    ("jobs", "named"),
    [
        pytest.param(
            [{**BACKUP, "id": "backup-5f3c2a1b-7d4e", "vmid": "100,101"}],
            "job backup-5f3c2a1b-7d4e (vmid list) still includes vmid 100: pvegpu edits no backup job (no "
            "purge), so it backs",
            id="one",
        ),
        pytest.param(
            [
                {**BACKUP, "id": "listed", "vmid": "101 102"},  # not this vmid
                {**BACKUP, "id": "daily", "all": 1, "exclude": "101"},
                {**BACKUP, "id": "other-node", "all": 1, "node": "pve2"},
                {**BACKUP, "id": "excluded", "all": 1, "exclude": "100;101"},
                {**BACKUP, "id": "pooled", "pool": "gpu", "enabled": 0},
            ],
            "jobs daily (all guests), pooled (pool gpu, if the pool holds it, disabled) still include vmid "
            "100: pvegpu edits no backup job (no purge), so they back",
            id="many",
        ),
    ],
)
def test_own_dead_create_destroyed_names_the_backup_jobs_that_include_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, jobs: list[dict[str, object]], named: str
) -> None:
    api = dead_create_api(vm_store({**STUB}))
    api.answers[("GET", "/cluster/backup")] = jobs

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        commands, _ = converge(api, ledger(tmp_path, record=CreateRecord(None, STARTED - 1)))
        execute(commands)

    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        WARNING,
        f"[pve1] VM 100 destroyed, but backup {named} up the VM created again",
    ]
    assert [call[:2] for call in api.writes()] == [
        ("PUT", CONFIG_PATH),
        ("DELETE", "/nodes/pve1/qemu/100"),  # no purge: no backup job edited
        ("POST", "/nodes/pve1/qemu"),
    ]


def test_own_dead_create_destroyed_says_when_the_backup_jobs_cannot_be_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api = dead_create_api(vm_store({**STUB}))
    api.answers[("GET", "/cluster/backup")] = PveError(403, "Permission check failed (/, Sys.Audit)")

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        commands, _ = converge(api, ledger(tmp_path, record=CreateRecord(None, STARTED - 1)))
        execute(commands)

    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING][1:] == [
        "[pve1] VM 100: the backup jobs that may include it not read (GET /cluster/backup: Permission check "
        "failed (/, Sys.Audit)); pvegpu edits none"
    ]


def test_error_an_earlier_record_that_differs_from_this_clusters_is_refused(tmp_path: Path) -> None:
    """An earlier pvegpu kept the record without the cluster (guest-keys/tasks/): moved into place on first
    use, but refused, both kept, when this cluster's folder holds a different one."""
    records = ledger(tmp_path, record=CreateRecord(None, STARTED - 1, "5eed" * 8))
    earlier = tmp_path / "guest-keys/tasks/pve1-qemu-100.json"
    earlier.parent.mkdir()
    earlier.write_text(f'{{"nonce": null, "sent": {STARTED}, "upid": null}}\n')
    api = dead_create_api(vm_store({**STUB}))

    with pytest.raises(OperationError) as error:
        converge(api, records)

    assert str(error.value) == (
        f"VM 100: {earlier} (an earlier pvegpu's record, kept without the cluster) and {tmp_path}/guest-keys/"
        "pve1/tasks/pve1-qemu-100.json both exist and differ; keep the one whose nonce is on the guest's "
        "`pvegpu-create:` description line, delete the other, then run again"
    )
    assert api.writes() == []
    assert earlier.exists()
