"""`converge` (through `q35_vm`, `lxc_container`) and what a dead create left: pvegpu's own (its record,
pvegpu/create_records.py) is unlocked, destroyed and created again in the same run; anything else is
reported with its task and the exact command, untouched. And the record's life in `_create`: written before
the POST, given the UPID, removed once the guest is whole."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.create_records import CreateLedger, ledger_beside
from pvegpu.models.pve_root_only import root_only_params
from pvegpu.operations.lxc import lxc_container
from pvegpu.plan.dead_create import CreateRecord
from pvegpu.pve import Params, PveError
from tests.unit.fake_pve import UPID_CREATE, ConfigStore, FakeApi, execute, task_ok
from tests.unit.op_harness import run_op
from tests.unit.test_ops_vm import (
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
    made = ledger_beside(tmp_path / "known_hosts", user)
    assert made is not None
    if record is not None:
        made.write("pve1", "qemu", 100, record)
    return made


def dead_create_api(store: ConfigStore, user: str = "root@pam") -> FakeApi:
    def destroy(_params: dict[str, Any]) -> str:
        store.values = None
        return UPID_DESTROY

    return FakeApi(
        {
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
        ("DELETE", "/nodes/pve1/qemu/100", {"destroy-unreferenced-disks": True, "purge": True}),
        ("POST", "/nodes/pve1/qemu", {"vmid": 100, **CONFIG, **CREATE}),
    ]
    assert not records.path("pve1", "qemu", 100).exists()  # whole: the record is gone


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
    api = FakeApi({("GET", "/nodes/pve1/lxc/200/config"): STUB, ("GET", TASKS): [task]})

    with caplog.at_level(logging.INFO, logger="pyinfra"), pytest.raises(OperationError) as error:
        run_op(
            lxc_container,
            {},
            api=api.client,
            node="pve1",
            vmid=200,
            config={},
            create={},
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

    with pytest.raises(OperationError):
        execute(commands)

    [during] = seen
    assert during is not None
    assert during.upid == UPID_CREATE
    assert records.read("pve1", "qemu", 100) == during  # not whole: kept for the next run
    assert oct(records.path("pve1", "qemu", 100).stat().st_mode & 0o777) == "0o600"


def test_create_refused_before_anything_was_made_forgets_the_record(tmp_path: Path) -> None:
    records = ledger(tmp_path)
    store = vm_store(None)
    refused = PveError(500, "unable to create VM 100 - no space left")
    api = FakeApi({("GET", CONFIG_PATH): store.get, ("POST", "/nodes/pve1/qemu"): refused})
    commands, _ = converge(api, records)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert (
        str(error.value)
        == "VM 100 not created: POST /nodes/pve1/qemu: unable to create VM 100 - no space left"
    )
    assert not records.path("pve1", "qemu", 100).exists()


def test_no_known_hosts_file_keeps_no_records() -> None:
    assert ledger_beside(None, "root@pam") is None
    assert ledger_beside("~/kh", "root@pam") == CreateLedger(Path.home() / "guest-keys/tasks", "root@pam")
