"""`q35_vm`, `guest_running` (a VM), `guest_gpus`: API state in -> exact API calls out (when executed), or
the noop sentence, or the error. API answers and error texts follow proxmox-api-behaviour.md §4-5 (config
values typed as Proxmox types them: ints for integer keys, strings otherwise; missing VM; checksum
mismatch)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.local.create_records import CreateLedger
from pvegpu.models.vm import VmSpec
from pvegpu.operations.pve_guest import VM, Guest, guest_running
from pvegpu.operations.vm import guest_gpus, q35_vm
from pvegpu.plan.mmio import MmioWindow
from pvegpu.plan.vm import VmPlan, create_keys, vm_config
from pvegpu.pve.errors import PveConnectionError, PveError, Unparsed
from tests.unit.fake_pve import (
    NONCED,
    UPID_CREATE,
    UPID_START,
    ConfigStore,
    FakeApi,
    execute,
    sequence,
    task_ok,
)
from tests.unit.hostdata import two_cards
from tests.unit.op_harness import run_op

SPEC = VmSpec(vmid=100, cores=16, memory=65536)
IDS = [f"gpu{n}" for n in range(8)]
MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=4194304"
WINDOW = MmioWindow(bar_bytes=1 << 40, window_mib=4194304, args=MMIO, phys_bits=44)
CONFIG = vm_config(SPEC, IDS, WINDOW)
CREATE = create_keys(SPEC)
PLAN = VmPlan(SPEC, CONFIG, CREATE, clique="", storages={}, unbound=(), problem=None)
CONFIG_PATH = "/nodes/pve1/qemu/100/config"
MISSING = PveError(500, "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist")
MISMATCH = "checksum mismatch (file change by other user?)"


def created_config(**changes: object) -> dict[str, object]:
    """The config Proxmox returns for the VM pvegpu created (ints where Proxmox types them so)."""
    values: dict[str, object] = {
        **CONFIG,
        "cores": 16,
        "sockets": 1,
        "numa": 1,
        "balloon": 0,
        "onboot": 1,
        "efidisk0": "local-lvm:vm-100-disk-0,efitype=4m,pre-enrolled-keys=0,size=4M",
        "scsi0": "local-lvm:vm-100-disk-1,iothread=1,size=200G",
        "net0": "virtio=BC:24:11:3F:00:12,bridge=vmbr0",
        "boot": "order=scsi0;net0",
        "meta": "creation-qemu=9.2.0,ctime=1764400000",
        "vmgenid": "8d5f7d36-7a43-4a8e-9a1e-4f0a7d9d0c11",
        "digest": "c0ffee",
    }
    values.update(changes)
    return {key: value for key, value in values.items() if value is not None}


def vm_store(values: dict[str, object] | None) -> ConfigStore:
    return ConfigStore(values, missing=MISSING, mismatch=MISMATCH)


def config_api(store: ConfigStore, **answers: object) -> FakeApi:
    """The store's GET and PUT of the config, plus `answers` by (method, path)."""
    return FakeApi({("GET", CONFIG_PATH): store.get, ("PUT", CONFIG_PATH): store.put, **answers})  # type: ignore[dict-item]


def converge(api: FakeApi, ledger: CreateLedger | None = None) -> tuple[list[Any], list[str]]:
    """`q35_vm` of PLAN (CONFIG/CREATE) on pve1's VM 100 through `api`; `ledger`: pvegpu's create records."""
    return run_op(
        q35_vm,
        {},
        guest=Guest(VM, api.client, "pve1", 100),
        vm=PLAN,
        timeout_s=5,
        ledger=ledger,
    )


def test_vm_config_keys() -> None:
    assert {
        "name": "llm",
        "machine": "q35",
        "bios": "ovmf",
        "ostype": "l26",
        "cpu": "host",
        "sockets": "1",
        "cores": "16",
        "memory": "65536",
        "numa": "1",
        "balloon": "0",
        "agent": "1",
        "onboot": "1",
        "scsihw": "virtio-scsi-single",
        **{f"hostpci{n}": f"mapping=gpu{n},pcie=1" for n in range(8)},
        "args": MMIO,
        "hookscript": "local:snippets/pvegpu-hook",
    } == CONFIG
    assert CREATE == {
        "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=0",
        "scsi0": "local-lvm:200,iothread=1",
        "net0": "virtio,bridge=vmbr0",
    }
    guest_phys = replace(WINDOW, cpu="host,guest-phys-bits=45")  # plan/mmio.py's, on qemu-server 9.0.18+
    phys = vm_config(VmSpec(vmid=100, mmio="phys-bits", hugepages="1024"), IDS[:1], guest_phys)
    assert (phys["cpu"], phys["hugepages"], "args" in phys) == ("host,guest-phys-bits=45", "1024", False)
    assert vm_config(VmSpec(vmid=100, mmio="args"), IDS[:1], guest_phys)["cpu"] == "host"


def test_create_when_absent_posts_every_key_and_waits_for_the_task() -> None:
    store = vm_store(None)
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("POST", "/nodes/pve1/qemu"): store.create(created_config(), UPID_CREATE),
            ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status"): task_ok(UPID_CREATE),
        }
    )

    commands, noops = converge(api)
    execute(commands)

    assert noops == []
    assert api.writes() == [("POST", "/nodes/pve1/qemu", {"vmid": 100, **CONFIG, **CREATE, **NONCED})]
    assert api.calls[-2:] == [
        ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status", {}),
        ("GET", CONFIG_PATH, {}),  # read back
    ]


def test_noop_second_run_with_8_hostpci_entries() -> None:
    api = FakeApi({("GET", CONFIG_PATH): created_config()})

    commands, noops = converge(api)

    assert commands == []
    assert noops == ["VM 100 (llm) on pve1 has its config: q35, ovmf, 8 hostpci devices"]


def test_update_puts_only_differing_keys_with_the_digest_and_keeps_operator_args_and_disks() -> None:
    current = created_config(
        cores=8,
        hostpci3="mapping=gpu3,pcie=0",
        hostpci9="mapping=gpu9,pcie=1",
        args="-cpu kvm=on -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536",
        hugepages="2",
        net0="virtio=BC:24:11:3F:00:12,bridge=vmbr1",
    )
    store = vm_store(current)
    api = config_api(store)

    commands, _ = converge(api)
    execute(commands)

    assert store.values == created_config(
        cores="16", args=f"-cpu kvm=on {MMIO}", hostpci3="mapping=gpu3,pcie=1", digest="c0ffee+"
    )
    assert api.writes() == [
        (
            "PUT",
            CONFIG_PATH,
            {
                "cores": "16",
                "args": f"-cpu kvm=on {MMIO}",
                "net0": "virtio=BC:24:11:3F:00:12,bridge=vmbr0",
                "hostpci3": "mapping=gpu3,pcie=1",
                "delete": "hugepages,hostpci9",
                "digest": "c0ffee",
            },
        )
    ]


def test_update_adds_a_missing_disk_never_recreates_the_vm() -> None:
    api = config_api(vm_store(created_config(scsi0=None)))

    commands, _ = converge(api)
    execute(commands)

    assert api.writes() == [("PUT", CONFIG_PATH, {"scsi0": "local-lvm:200,iothread=1", "digest": "c0ffee"})]


def test_error_digest_mismatch_overwrites_nothing() -> None:
    store = vm_store(created_config(cores=8))
    api = config_api(store)
    commands, _ = converge(api)
    store.values = created_config(cores=8, name="theirs", digest="beef")  # someone else's edit meanwhile

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 config not updated, nothing overwritten: "
        "PUT /nodes/pve1/qemu/100/config: checksum mismatch (file change by other user?)"
    )


def test_error_slot_held_by_a_device_pvegpu_does_not_own() -> None:
    api = FakeApi({("GET", CONFIG_PATH): created_config(hostpci0="0000:61:00.0,pcie=1")})

    with pytest.raises(OperationError) as error:
        converge(api)

    assert str(error.value) == (
        "VM 100: hostpci0 holds '0000:61:00.0,pcie=1', which is not a gpu<N> mapping: free the slot first"
    )


def start(api: FakeApi, unbound: tuple[str, ...] = ()) -> tuple[list[Any], list[str]]:
    return run_op(guest_running, {}, guest=Guest(VM, api.client, "pve1", 100), unbound=unbound, timeout_s=5)


STATUS = "/nodes/pve1/qemu/100/status/current"


def status(state: str) -> dict[str, object]:
    return {"vmid": 100, "status": state, "qmpstatus": state, "name": "llm"}


def test_noop_vm_running() -> None:
    api = FakeApi({("GET", CONFIG_PATH): created_config(), ("GET", STATUS): status("running")})

    commands, noops = start(api)

    assert (commands, noops) == ([], ["VM 100 is running on pve1"])


def test_start_waits_for_the_task_then_for_running() -> None:
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): created_config(),
            ("GET", STATUS): sequence(status("stopped"), status("running")),
            ("POST", "/nodes/pve1/qemu/100/status/start"): UPID_START,
            ("GET", f"/nodes/pve1/tasks/{UPID_START}/status"): task_ok(UPID_START),
        }
    )

    commands, _ = start(api)
    execute(commands)

    assert api.writes() == [("POST", "/nodes/pve1/qemu/100/status/start", {})]
    assert api.calls[-1] == ("GET", STATUS, {})


def test_error_start_fails_with_proxmox_message() -> None:
    invalid = (
        "PCI device mapping invalid (hardware probably changed): "
        "'iommugroup' does not match for 'gpu0' (13 != 12) "
    )
    failed = {"upid": UPID_START, "status": "stopped", "exitstatus": invalid}
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): created_config(),
            ("GET", STATUS): status("stopped"),
            ("POST", "/nodes/pve1/qemu/100/status/start"): UPID_START,
            ("GET", f"/nodes/pve1/tasks/{UPID_START}/status"): failed,
            ("GET", f"/nodes/pve1/tasks/{UPID_START}/log"): [{"n": 1, "t": f"TASK ERROR: {invalid}"}],
        }
    )
    commands, _ = start(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == f"VM 100 did not start: {invalid}"


def test_error_start_refused_while_vfio_binding_is_not_in_effect() -> None:
    api = FakeApi({("GET", CONFIG_PATH): created_config(), ("GET", STATUS): status("stopped")})

    with pytest.raises(OperationError) as error:
        start(api, ("0000:41:00.0 (nvidia)", "0000:41:00.1 (snd_hda_intel)"))

    assert str(error.value) == (
        "refusing to start VM 100: vfio binding not in effect on pve1 for "
        "0000:41:00.0 (nvidia), 0000:41:00.1 (snd_hda_intel) (run deploy/host.py)"
    )
    assert api.writes() == []


def test_guest_gpus_noop_and_error() -> None:
    _, noops = run_op(guest_gpus, {}, hardware=two_cards(), expected=2)
    assert noops == ["the guest sees 2 NVIDIA GPUs: 0000:41:00.0, 0000:51:00.0"]

    with pytest.raises(OperationError) as error:
        run_op(guest_gpus, {}, hardware=two_cards(), expected=8)
    assert str(error.value) == "the guest sees 2 NVIDIA GPUs, expected 8: 0000:41:00.0, 0000:51:00.0"


# --- honest outcomes and garbage: what is said follows what reading back shows ----------------------------

HTML = Unparsed("<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>\n")
TASK_CREATE = f"/nodes/pve1/tasks/{UPID_CREATE}/status"
CUT = PveConnectionError("ssh root@pve1:22: SSH session not active")


def test_drift_create_cut_after_the_task_ran_is_created_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = vm_store(None)
    created = store.create(created_config(), UPID_CREATE)

    def cut(params: dict[str, Any]) -> str:
        created(params)
        raise CUT

    api = FakeApi({("GET", CONFIG_PATH): store.get, ("POST", "/nodes/pve1/qemu"): cut})
    commands, _ = converge(api)

    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        execute(commands)

    assert caplog.messages == [
        "[pve1] VM 100: POST /nodes/pve1/qemu: ssh root@pve1:22: SSH session not active; "
        "reading it back shows the config as planned"
    ]


def test_error_create_that_wrote_nothing_says_not_created_with_what_came_back() -> None:
    api = FakeApi({("GET", CONFIG_PATH): MISSING, ("POST", "/nodes/pve1/qemu"): HTML})
    commands, _ = converge(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 not created: POST /nodes/pve1/qemu: expected a task id (UPID), got '<!DOCTYPE html>'"
    )
    assert len(api.writes()) == 1


def test_error_garbage_task_status_after_create_is_judged_by_reading_back() -> None:
    store = vm_store(None)
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("POST", "/nodes/pve1/qemu"): store.create(created_config(cores=8), UPID_CREATE),
            ("GET", TASK_CREATE): HTML,
        }
    )
    commands, _ = converge(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 created, but its config still differs: cores 8 (sent 16) after "
        f"GET {TASK_CREATE}: expected an object, got '<!DOCTYPE html>'; run again"
    )


def test_error_put_answering_garbage_with_exit_0_that_wrote_nothing() -> None:
    store = vm_store(created_config(cores=8))
    api = FakeApi({("GET", CONFIG_PATH): store.get, ("PUT", CONFIG_PATH): HTML})
    commands, _ = converge(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        "VM 100 config not updated, nothing overwritten: PUT /nodes/pve1/qemu/100/config answered without "
        "an error, but reading it back shows those keys unchanged"
    )


@pytest.mark.parametrize(
    ("answer", "got"),
    [
        (HTML, "expected an object, got '<!DOCTYPE html>'"),
        (Unparsed('{"cores":16,"dige'), """expected an object, got '{"cores":16,"dige'"""),
        ([], "expected an object, got '[]'"),
        ({"cores": 16}, """expected a config with a 'digest', got '{"cores": 16}'"""),
    ],
    ids=["html", "cut", "list", "no-digest"],
)
def test_error_garbage_config_read_fails_the_host_before_any_write(answer: object, got: str) -> None:
    api = FakeApi({("GET", CONFIG_PATH): lambda _params: answer})

    with pytest.raises(OperationError) as error:
        converge(api)

    assert str(error.value) == f"VM 100 not read: GET /nodes/pve1/qemu/100/config: {got}; nothing written"
    assert api.writes() == []


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        (
            {("POST", "/nodes/pve1/qemu/100/status/start"): HTML},
            "VM 100 not started: POST /nodes/pve1/qemu/100/status/start: expected a task id (UPID), "
            "got '<!DOCTYPE html>'",
        ),
        (
            {
                ("POST", "/nodes/pve1/qemu/100/status/start"): UPID_START,
                ("GET", f"/nodes/pve1/tasks/{UPID_START}/status"): {"upid": UPID_START},
            },
            f"VM 100 not started: GET /nodes/pve1/tasks/{UPID_START}/status: expected an object with "
            f"""'status', got '{{"upid": "{UPID_START}"}}'""",
        ),
        (
            {
                ("POST", "/nodes/pve1/qemu/100/status/start"): UPID_START,
                ("GET", f"/nodes/pve1/tasks/{UPID_START}/status"): task_ok(UPID_START),
                ("GET", STATUS): sequence(status("stopped"), HTML),
            },
            f"VM 100: waiting until it is running: GET {STATUS}: expected an object, got '<!DOCTYPE html>'",
        ),
    ],
    ids=["start-post", "task-status", "status-current"],
)
def test_error_garbage_while_starting_names_the_endpoint(
    answers: dict[tuple[str, str], object], message: str
) -> None:
    api = FakeApi({("GET", CONFIG_PATH): created_config(), ("GET", STATUS): status("stopped"), **answers})
    commands, _ = start(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == message
    assert api.writes() == [("POST", "/nodes/pve1/qemu/100/status/start", {})]


# --- leftovers of interrupted tasks: reported with the task and the exact command, never taken over -------

TASKS = "/nodes/pve1/tasks"
DEAD_CREATE = {
    "upid": UPID_CREATE,
    "node": "pve1",
    "type": "qmcreate",
    "id": "100",
    "user": "root@pam",
    "starttime": 1722000000,
    "status": "unexpected status",
    "endtime": 1722000005,
}
STUB = {"lock": "create", "digest": "5tub"}


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        (
            [DEAD_CREATE],
            f"VM 100 is locked (create); its last task {UPID_CREATE} no longer runs (exit status: unexpected "
            "status): check VM 100 on pve1, remove the lock with `qm unlock 100` there, then run again",
        ),
        (
            [{key: value for key, value in DEAD_CREATE.items() if key not in ("status", "endtime")}],
            f"VM 100 is locked (create) by task {UPID_CREATE}, which still runs: run again when it has ended",
        ),
        (
            [],
            "VM 100 is locked (create) and Proxmox lists no task of it: check VM 100 on pve1, remove the "
            "lock with `qm unlock 100` there, then run again",
        ),
    ],
    ids=["dead-task", "running-task", "no-task"],
)
def test_error_locked_vm_is_reported_with_its_task_and_the_unlock_command(
    tasks: list[dict[str, object]], message: str
) -> None:
    api = FakeApi({("GET", CONFIG_PATH): STUB, ("GET", TASKS): tasks})

    with pytest.raises(OperationError) as error:
        converge(api)

    assert str(error.value) == message
    assert api.calls[-1] == ("GET", TASKS, {"vmid": 100, "source": "all", "limit": 10})
    assert api.writes() == []


def test_error_locked_vm_is_not_started() -> None:
    api = FakeApi({("GET", CONFIG_PATH): {**created_config(), "lock": "backup"}, ("GET", TASKS): []})

    with pytest.raises(OperationError) as error:
        start(api)

    assert str(error.value) == (
        "VM 100 is locked (backup) and Proxmox lists no task of it: check VM 100 on pve1, remove the lock "
        "with `qm unlock 100` there, then run again"
    )
    assert api.writes() == []


def test_error_half_made_vm_after_an_unlock_is_reported_never_accepted() -> None:
    half = {"scsi0": "local-lvm:200,iothread=1", "net0": "virtio,bridge=vmbr0", **CONFIG, "digest": "h1"}
    api = FakeApi({("GET", CONFIG_PATH): half, ("GET", TASKS): [DEAD_CREATE]})  # no record: not pvegpu's

    with pytest.raises(OperationError) as error:
        converge(api)

    assert str(error.value) == (
        "VM 100 on pve1 was never completely created: net0 virtio,bridge=vmbr0 has no MAC address; "
        "scsi0 local-lvm:200,iothread=1 was never allocated: pvegpu does not take it over; remove it "
        "(`qm destroy 100`) or finish it by hand, then run again"
    )
    assert api.writes() == []


def test_error_create_whose_task_was_killed_says_so_from_the_read_back() -> None:
    store = vm_store(None)
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("POST", "/nodes/pve1/qemu"): store.create(STUB, UPID_CREATE),
            ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status"): {
                "upid": UPID_CREATE,
                "status": "stopped",
                "exitstatus": "unexpected status",
            },
            ("GET", TASKS): [DEAD_CREATE],
        }
    )
    commands, _ = converge(api)

    with pytest.raises(OperationError) as error:
        execute(commands)

    assert str(error.value) == (
        f"VM 100 not completely created after task {UPID_CREATE}: unexpected status: VM 100 is locked "
        "(create); its last task "
        f"{UPID_CREATE} no longer runs (exit status: unexpected status): check VM 100 on pve1, remove the "
        "lock with `qm unlock 100` there, then run again"
    )
    assert len(api.writes()) == 1


def test_a_token_without_a_root_path_is_refused_a_root_only_key_root_wrote_before_anything_is_sent() -> None:
    """`vm.self_heal: off` with `pve.root_ssh: false` on a VM whose hookscript root wrote in an earlier run:
    the PUT would delete it, which Proxmox refuses a token (`only root can set 'hookscript' config`)."""
    token = "pvegpu@pve!deploy"
    without_hook = {key: value for key, value in CONFIG.items() if key not in ("hookscript", "args")}
    api = FakeApi({("GET", CONFIG_PATH): created_config(args=None, cores=8)}, user=token)

    with pytest.raises(OperationError) as error:
        run_op(
            q35_vm, {}, guest=Guest(VM, api.client, "pve1", 100), vm=replace(PLAN, config=without_hook),
            timeout_s=5,
        )  # fmt: skip

    assert str(error.value) == (
        "VM 100: the API token pvegpu@pve!deploy cannot delete 'hookscript' (Proxmox allows it to root@pam "
        "only): remove it as root on pve1 (`qm set 100 --delete hookscript`), or let pvegpu reach the node "
        "as root over SSH (pve.root_ssh: true)"
    )
    assert api.writes() == []


def test_a_token_without_a_root_path_is_refused_setting_a_root_only_key() -> None:
    api = FakeApi({("GET", CONFIG_PATH): created_config(args=None)}, user="pvegpu@pve!deploy")

    with pytest.raises(OperationError) as error:
        converge(api)

    assert str(error.value) == (
        "VM 100: the API token pvegpu@pve!deploy cannot set 'args' (Proxmox allows it to root@pam only): "
        "let pvegpu reach the node as root over SSH (pve.root_ssh: true)"
    )
    assert api.writes() == []
