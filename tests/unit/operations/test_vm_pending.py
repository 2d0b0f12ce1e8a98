"""`vm_pending` (pvegpu/operations/vm.py): a running VM's `[PENDING]` keys (GET …/config against
`current=1`, proxmox-api-behaviour.md §4.4) are applied by a cold restart when `pve_host.allow_reboot`
allows it, else reported with the command that applies them; a run that wrote the config decides again when
it executes. API in -> exact calls, warning and noop sentence out."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.operations.pve_guest import VM, Guest, guest_running
from pvegpu.operations.start_failure import start_failure
from pvegpu.operations.vm import vm_pending
from pvegpu.plan.vm import pending_keys
from pvegpu.pve.errors import PveError, TaskFailedError
from tests.unit.fake_pve import FakeApi, execute, task_ok
from tests.unit.op_harness import run_op

VMP = "/nodes/pve1/qemu/100"
TASKS = "/nodes/pve1/tasks"
UPID_SHUTDOWN = "UPID:pve1:0000A1D0:0153F2C4:66A1B2E0:qmshutdown:100:root@pam:"
UPID_START = "UPID:pve1:0000A1D1:0153F2C4:66A1B2E1:qmstart:100:root@pam:"
MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
CLIQUE = "-set device.hostpci0.x-nv-gpudirect-clique=0 -set device.hostpci1.x-nv-gpudirect-clique=0"
NOW = {"name": "llm", "cpu": "host", "args": MMIO, "hostpci0": "mapping=gpu0,pcie=1", "digest": "d1"}
WARNING = (
    "[pve1] VM 100: args, hugepages pending: Proxmox applies them at the VM's next cold start, not while it "
    "runs nor at a reboot inside the guest; pve_host.allow_reboot is false: pvegpu does not restart it; to "
    "apply them, on pve1: qm shutdown 100 && qm start 100"
)


class Vm:
    """A VM's config as Proxmox holds it: the values in effect and its [PENDING] section (set values and
    deletes), `running` or not; a cold start (shutdown, then start) applies the pending section."""

    def __init__(
        self, pending: dict[str, object], deleted: tuple[str, ...] = (), *, running: bool = True
    ) -> None:
        self.now: dict[str, object] = dict(NOW)
        self.pending = pending
        self.deleted = deleted
        self.running = running
        self.restart_applies = True

    def answers(self) -> dict[tuple[str, str], object]:
        return {
            ("GET", f"{VMP}/config"): self._config,
            ("GET", f"{VMP}/status/current"): self._status,
            ("POST", f"{VMP}/status/shutdown"): self._shutdown,
            ("POST", f"{VMP}/status/start"): self._start,
            ("GET", f"{TASKS}/{UPID_SHUTDOWN}/status"): task_ok(UPID_SHUTDOWN),
            ("GET", f"{TASKS}/{UPID_START}/status"): task_ok(UPID_START),
        }

    def _config(self, params: dict[str, Any]) -> dict[str, object]:
        if params.get("current"):
            return dict(self.now)
        overlaid = {**self.now, **self.pending}
        return {key: value for key, value in overlaid.items() if key not in self.deleted}

    def _status(self, _params: dict[str, Any]) -> dict[str, object]:
        state = "running" if self.running else "stopped"
        return {"vmid": 100, "status": state, "qmpstatus": state}

    def _shutdown(self, _params: dict[str, Any]) -> str:
        self.running = False
        return UPID_SHUTDOWN

    def _start(self, _params: dict[str, Any]) -> str:
        if self.restart_applies:
            self.now = self._config({})
            self.pending, self.deleted = {}, ()
        self.running = True
        return UPID_START


def pending_op(vm: Vm, *, allow: bool, changing: bool = False) -> tuple[FakeApi, list[Any], list[str]]:
    api = FakeApi(vm.answers())
    commands, noops = run_op(
        vm_pending,
        {},
        guest=Guest(VM, api.client, "pve1", 100),
        allow_restart=allow,
        config_changing=lambda: changing,
        timeout_s=5,
    )
    return api, commands, noops


def test_pending_keys_are_set_changed_and_deleted_keys() -> None:
    next_start = {"name": "llm", "args": f"{MMIO} {CLIQUE}", "memory": 8192, "digest": "d2"}
    now = {"name": "llm", "args": MMIO, "memory": "8192", "hugepages": "1024", "digest": "d1"}
    assert pending_keys(next_start, now) == ("args", "hugepages")
    assert pending_keys(now, now) == ()


@pytest.mark.parametrize("running", [True, False])
def test_noop_nothing_pending_or_not_running(running: bool) -> None:
    """A stopped VM has nothing pending that its start would not apply."""
    _, commands, noops = pending_op(Vm({"args": "x"} if not running else {}, running=running), allow=False)
    assert (commands, noops) == ([], ["VM 100 has no pending changes"])


def test_noop_pending_reported_with_the_command_when_no_restart_is_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vm = Vm({"args": f"{MMIO} {CLIQUE}"}, deleted=("hugepages",))
    vm.now["hugepages"] = "1024"
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        api, commands, noops = pending_op(vm, allow=False)
    assert commands == []
    assert noops == ["VM 100: args, hugepages pending, not applied"]
    assert caplog.messages == [WARNING]
    assert api.writes() == []


def test_update_pending_applied_by_a_cold_restart_when_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.vm.guest_in_run", lambda _host: False)
    vm = Vm({"args": f"{MMIO} {CLIQUE}"})
    api, commands, noops = pending_op(vm, allow=True)
    assert noops == []
    execute(commands)
    assert api.writes() == [
        ("POST", f"{VMP}/status/shutdown", {"timeout": 5}),
        ("POST", f"{VMP}/status/start", {}),
    ]
    assert vm.now["args"] == f"{MMIO} {CLIQUE}"
    assert api.calls[-2:] == [("GET", f"{VMP}/config", {}), ("GET", f"{VMP}/config", {"current": True})]


def test_update_a_config_written_in_this_run_is_decided_when_it_executes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing pending while preparing, but an earlier operation writes the config (`config_changing`): the
    decision is made again when it executes, and what the write left pending is reported."""
    vm = Vm({})
    api, commands, noops = pending_op(vm, allow=False, changing=True)
    assert noops == []
    vm.pending = {"args": f"{MMIO} {CLIQUE}"}  # the earlier PUT, executed first
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        execute(commands)
    assert caplog.messages == [
        "[pve1] VM 100: args pending: Proxmox applies it at the VM's next cold start, not while it runs nor "
        "at a reboot inside the guest; pve_host.allow_reboot is false: pvegpu does not restart it; to apply "
        "it, on pve1: qm shutdown 100 && qm start 100"
    ]
    assert api.writes() == []


def test_error_still_pending_after_the_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.vm.guest_in_run", lambda _host: False)
    vm = Vm({"machine": "pc-q35-9.2+pve1"})
    vm.restart_applies = False
    _, commands, _ = pending_op(vm, allow=True)
    with pytest.raises(OperationError) as error:
        execute(commands)
    assert str(error.value) == "VM 100: machine still pending after a cold restart"


def test_noop_restart_deferred_while_the_run_converges_the_guest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("pvegpu.operations.vm.guest_in_run", lambda _host: True)
    vm = Vm({"args": f"{MMIO} {CLIQUE}"})
    api, commands, _ = pending_op(vm, allow=True)
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        execute(commands)
    assert caplog.messages == [
        "[pve1] VM 100: args pending: Proxmox applies it at the VM's next cold start, not while it runs nor "
        "at a reboot inside the guest; this run also converges its guest, whose connection a restart would "
        "cut: run deploy/vm.py; to apply it, on pve1: qm shutdown 100 && qm start 100"
    ]
    assert api.writes() == []


QEMU_LINE = 'kvm: -set device.hostpci0.0.x-nv-gpudirect-clique=0: there is no device "hostpci0" defined'
START_FAILED = "start failed: QEMU exited with code 1"


@pytest.mark.parametrize(
    ("log", "line"),
    [
        (  # a node: QEMU's stderr in the task log, qemu-server's own error last
            [{"n": 1, "t": QEMU_LINE}, {"n": 2, "t": f"TASK ERROR: {START_FAILED}"}],
            f"{QEMU_LINE} ({START_FAILED})",
        ),
        ([{"n": 1, "t": f"TASK ERROR: {START_FAILED}"}], START_FAILED),  # nothing more than the status
        (PveError(501, "Method 'GET /nodes/pve1/tasks/x/log' not implemented"), START_FAILED),
    ],
)
def test_start_failure_is_qemus_own_line_then_the_exit_status(log: object, line: str) -> None:
    api = FakeApi({("GET", f"{TASKS}/{UPID_START}/log"): log})
    assert start_failure(api.client, TaskFailedError(UPID_START, START_FAILED)) == line


def test_error_start_refused_by_qemu_names_the_vm_and_the_part() -> None:
    """An operator's `args` part in the earlier dotted form: QEMU refuses the start; the one line names the
    VM and, in QEMU's own words, the part."""
    vm = Vm({}, running=False)
    answers = vm.answers()
    failed = {"upid": UPID_START, "status": "stopped", "exitstatus": START_FAILED}
    answers[("GET", f"{TASKS}/{UPID_START}/status")] = failed
    answers[("GET", f"{TASKS}/{UPID_START}/log")] = [
        {"n": 1, "t": QEMU_LINE},
        {"n": 2, "t": f"TASK ERROR: {START_FAILED}"},
    ]
    api = FakeApi(answers)
    commands, _ = run_op(guest_running, {}, guest=Guest(VM, api.client, "pve1", 100), timeout_s=5)
    with pytest.raises(OperationError) as error:
        execute(commands)
    assert str(error.value) == f"VM 100 did not start: {QEMU_LINE} ({START_FAILED})"


def test_noop_executing_body_defers_the_restart_without_a_command(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`pyinfra -y` runs the body while executing (earlier writes done): a restart the run must not make
    (it converges the guest) is a noop with the warning, not a command."""
    monkeypatch.setattr("pvegpu.operations.vm._executing", lambda: True)
    monkeypatch.setattr("pvegpu.operations.vm.guest_in_run", lambda _host: True)
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        api, commands, noops = pending_op(Vm({"args": f"{MMIO} {CLIQUE}"}), allow=True, changing=True)
    assert (commands, noops) == ([], ["VM 100: args pending, not applied"])
    assert caplog.messages[0].endswith(
        "restart would cut: run deploy/vm.py; to apply it, on pve1: qm shutdown 100 && qm start 100"
    )
    assert api.writes() == []
