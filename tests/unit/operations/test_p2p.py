"""`p2p_clique` (pvegpu/operations/p2p.py) against a scripted Proxmox API: `on` changes nothing and warns;
the probe's agent exec is bounded by its deadline (a hang returns no exit status), each way a probe run ends
becomes the documented verdict, and nothing restarts while the run also converges the guest."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.models.p2p import RECORD_PATH
from pvegpu.operations.p2p import Exec, _judged, guest_exec, p2p_clique
from pvegpu.operations.pve_guest import VM, Guest
from pvegpu.operations.vm import guest_in_run
from pvegpu.plan.p2p import PROBE_PATH, timeout_failure
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import ConfigStore, FakeApi, MappingStore, execute, sequence, task_ok
from tests.unit.op_harness import run_op

VMP = "/nodes/pve1/qemu/100"
MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
OPERATOR = "-msg timestamp=on"
OURS = "-set device.hostpci0.x-nv-gpudirect-clique=0 -set device.hostpci1.x-nv-gpudirect-clique=0"


def config(args: str) -> dict[str, object]:
    return {
        "hostpci0": "mapping=gpu0,pcie=1",
        "hostpci1": "mapping=gpu1,pcie=1",
        "args": args,
        "digest": "d1",
    }


def clique_op(api: FakeApi, mode: str) -> tuple[list[Any], list[str]]:
    return run_op(
        p2p_clique,
        {},
        guest=Guest(VM, api.client, "pve1", 100),
        mode=mode,
        clique=OURS,
        prefix="gpu",
        venv="/opt/sglang/venv",
        probe_timeout_s=30,
        timeout_s=60,
    )


def test_noop_on_warns_and_changes_nothing() -> None:
    api = FakeApi({("GET", f"{VMP}/config"): config(f"{MMIO} {OURS}")})
    assert clique_op(api, "on") == ([], [f"VM 100: vm.p2p on, clique {OURS}"])
    assert api.writes() == []


def test_error_hang_is_bounded_by_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """exec-status says `exited: 0` forever: guest_exec gives up at its deadline with no exit status."""
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])  # wait_until looks them up at each call
    monkeypatch.setattr(time, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    api = FakeApi(
        {("POST", f"{VMP}/agent/exec"): {"pid": 7}, ("GET", f"{VMP}/agent/exec-status"): {"exited": 0}}
    )
    ran = guest_exec(Guest(VM, api.client, "pve1", 100), ["timeout", "30", "python3"], 45, "script")
    assert ran == Exec(None)
    assert now[0] == 45
    assert api.calls[0] == (
        "POST",
        f"{VMP}/agent/exec",
        {"command": ["timeout", "30", "python3"], "input-data": "script"},
    )
    assert _judged(ran, 30).failures == (timeout_failure(30),)


PASSED = {
    "pairs": [{"a": 0, "b": 1, "peer": {"ab": True, "ba": True}, "copy": {"ab": True, "ba": True}}],
    "allreduce": {
        "p2p": {"ranks": [{"rank": 0, "ok": True}], "latency_us": 3.0, "busbw_gbs": 40.0},
        "shm": {"ranks": [{"rank": 0, "ok": True}], "latency_us": 13.0, "busbw_gbs": 20.0},
    },
}


@pytest.mark.parametrize(
    ("ran", "verdict", "failures"),
    [
        (Exec(124), "shm", (timeout_failure(30),)),
        (Exec(137), "shm", (timeout_failure(30),)),
        (Exec(1, "", "Traceback\nRuntimeError: CUDA error: peer mapping\n"), "shm", (
            "the probe failed (exit status 1): RuntimeError: CUDA error: peer mapping",
        )),
        (Exec(0, "torch warning\n" + json.dumps(PASSED) + "\n"), "p2p", ()),
        (Exec(0, "not json"), "shm", ("the probe failed (exit status 0): no JSON result: 'not json'",)),
    ],
)  # fmt: skip
def test_probe_run_endings(ran: Exec, verdict: str, failures: tuple[str, ...]) -> None:
    judgement = _judged(ran, 30)
    assert (judgement.verdict, judgement.failures) == (verdict, failures)


class _Host(SimpleNamespace):
    __hash__ = object.__hash__  # type: ignore[assignment]  # pyinfra keys its per-host tables by Host


class _State:
    def __init__(self, hosts: list[_Host], ops: dict[str, int], limit: set[str]) -> None:
        self.inventory = hosts
        self.ops = {h: dict.fromkeys(range(ops.get(h.name, 0))) for h in hosts}
        self.limit = limit

    def is_host_in_limit(self, host: _Host) -> bool:
        return host.name in self.limit


@pytest.mark.parametrize(
    ("ops", "limit", "in_run"),
    [
        ({"llm": 3}, {"pve1", "llm"}, True),  # deploy/site.py with the guest up
        ({}, {"pve1", "llm"}, False),  # deploy/vm.py: the guest is left alone, no operations
        ({"llm": 3}, {"pve1"}, False),  # --limit pve1
    ],
)
def test_guest_in_run_only_when_the_guest_has_operations(
    ops: dict[str, int], limit: set[str], in_run: bool
) -> None:
    node = _Host(name="pve1", data={})
    guest = _Host(name="llm", data={"guest_of": "pve1"})
    other = _Host(name="other", data={"guest_of": "pve2"})
    node.state = _State([node, guest, other], {**ops, "other": 5}, limit | {"other"})
    assert guest_in_run(node) is in_run  # type: ignore[arg-type]


LINE0 = "id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:204b"
LINE1 = "id=10de:2bb1,node=pve1,path=0000:61:00,iommugroup=20,subsystem-id=10de:204b"
OTHER = "id=10de:2bb1,node=pve2,path=0000:21:00,iommugroup=9,subsystem-id=10de:204b"  # another node's line
UPID_SHUTDOWN = "UPID:pve1:0000A1C0:0153F2C4:66A1B2D0:qmshutdown:100:root@pam:"
UPID_START1 = "UPID:pve1:0000A1C1:0153F2C4:66A1B2D1:qmstart:100:root@pam:"
UPID_START2 = "UPID:pve1:0000A1C2:0153F2C4:66A1B2D2:qmstart:100:root@pam:"
QEMU_REFUSAL = 'kvm: -set device.hostpci0.x-nv-gpudirect-clique=0: there is no device "hostpci0" defined'
START_FAILED = "start failed: QEMU exited with code 1"  # qemu-server vm_start_nolock's task error
IDENTITY = {"driver": "580.95.05", "kernel": "6.8.0-49-generic"}


class Agent:
    """The guest agent's exec / exec-status / file-read / file-write, answered per command (the identity
    read gives IDENTITY, the probe run `probe_out`; every command exits 0), and the files written."""

    def __init__(self, probe_out: str = "") -> None:
        self.files: dict[str, str] = {}
        self.ran: list[list[str]] = []
        self.probe_out = probe_out

    def answers(self) -> dict[tuple[str, str], object]:
        agent = f"{VMP}/agent"
        return {
            ("POST", f"{agent}/exec"): self._exec,
            ("GET", f"{agent}/exec-status"): self._status,
            ("GET", f"{agent}/get-fsinfo"): {"result": []},
            ("GET", f"{agent}/file-read"): self._read,
            ("POST", f"{agent}/file-write"): self._write,
        }

    def _exec(self, params: dict[str, Any]) -> dict[str, int]:
        self.ran.append(list(params["command"]))
        return {"pid": len(self.ran)}

    def _status(self, params: dict[str, Any]) -> dict[str, object]:
        argv = self.ran[int(params["pid"]) - 1]
        out = json.dumps(IDENTITY) if argv[:3] == ["python3", "-", "identity"] else ""
        out = self.probe_out if argv[0] == "timeout" else out
        return {"exited": 1, "exitcode": 0, "out-data": out}

    def _read(self, params: dict[str, Any]) -> dict[str, str]:
        if params["file"] not in self.files:
            raise PveError(
                500, f"Agent error: Failed to open file '{params['file']}': No such file or directory"
            )
        return {"content": self.files[params["file"]]}

    def _write(self, params: dict[str, Any]) -> None:
        self.files[params["file"]] = params["content"]


def test_error_probe_vm_does_not_start_with_the_clique_falls_back_and_starts_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """QEMU refuses the start with the clique: the clique parts and the single-function paths are undone,
    the VM starts again (SHM), one warning names the VM with QEMU's own line, and SHM is recorded with it.
    The exact API sequence: reshape both mappings (this node's line only), set args, restart (shutdown,
    start: refused), read the start's log; then args without the clique, the whole slots back (in that
    order: never a clique on a whole slot), start, record."""
    monkeypatch.setattr("pvegpu.operations.p2p.guest_in_run", lambda _host: False)
    store = ConfigStore(config(MMIO), missing=PveError(500, "missing"), mismatch="checksum mismatch")
    mappings = MappingStore(("gpu0", [LINE0, OTHER]), ("gpu1", [LINE1]))
    agent = Agent()
    tasks = "/nodes/pve1/tasks"
    failed = {"upid": UPID_START1, "status": "stopped", "exitstatus": START_FAILED}
    log = [{"n": 1, "t": QEMU_REFUSAL}, {"n": 2, "t": f"TASK ERROR: {START_FAILED}"}]
    api = FakeApi(
        {
            ("GET", f"{VMP}/config"): store.get,
            ("PUT", f"{VMP}/config"): store.put,
            ("GET", f"{VMP}/status/current"): {"vmid": 100, "status": "running", "qmpstatus": "running"},
            ("POST", f"{VMP}/status/shutdown"): UPID_SHUTDOWN,
            ("POST", f"{VMP}/status/start"): sequence(UPID_START1, UPID_START2),
            ("GET", f"{tasks}/{UPID_SHUTDOWN}/status"): task_ok(UPID_SHUTDOWN),
            ("GET", f"{tasks}/{UPID_START1}/status"): failed,
            ("GET", f"{tasks}/{UPID_START1}/log"): log,
            ("GET", f"{tasks}/{UPID_START2}/status"): task_ok(UPID_START2),
            **mappings.answers("gpu0", "gpu1"),
            **agent.answers(),
        }
    )
    commands, noops = clique_op(api, "probe")
    assert noops == []
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        execute(commands)

    single0 = LINE0.replace("0000:41:00,", "0000:41:00.0,")
    single1 = LINE1.replace("0000:61:00,", "0000:61:00.0,")
    writes = [call for call in api.writes() if "/agent/" not in call[1]]
    assert writes == [
        ("PUT", "/cluster/mapping/pci/gpu0", {"map": [single0, OTHER], "digest": "d1"}),
        ("PUT", "/cluster/mapping/pci/gpu1", {"map": [single1], "digest": "d2"}),
        ("PUT", f"{VMP}/config", {"args": f"{MMIO} {OURS}", "digest": "d1"}),
        ("POST", f"{VMP}/status/shutdown", {"timeout": 60}),
        ("POST", f"{VMP}/status/start", {}),
        ("PUT", f"{VMP}/config", {"args": MMIO, "digest": "d1+"}),
        ("PUT", "/cluster/mapping/pci/gpu0", {"map": [LINE0, OTHER], "digest": "d3"}),
        ("PUT", "/cluster/mapping/pci/gpu1", {"map": [LINE1], "digest": "d4"}),
        ("POST", f"{VMP}/status/start", {}),
    ]
    assert ("GET", f"{tasks}/{UPID_START1}/log", {"start": 0, "limit": 0}) in api.calls
    assert mappings.maps == {"gpu0": [LINE0, OTHER], "gpu1": [LINE1]}
    assert store.values is not None
    assert store.values["args"] == MMIO
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = f"{QEMU_REFUSAL} ({START_FAILED})"
    assert warnings == [
        f"[pve1] VM 100 did not start with the GPUDirect clique: {said}; clique removed, its GPUs passed "
        "whole again, VM started: NCCL plan SHM"
    ]
    record = json.loads(agent.files[RECORD_PATH])
    assert (record["verdict"], record["failures"]) == (
        "shm",
        [f"the VM did not start with the GPUDirect clique: {said}"],
    )
    assert PROBE_PATH not in agent.files  # the probe never ran


def test_create_probe_sets_single_function_paths_with_the_clique(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clique set: both mappings single-function on this node, then args, then the cold restart; the
    probe passes, so they stay."""
    monkeypatch.setattr("pvegpu.operations.p2p.guest_in_run", lambda _host: False)
    store = ConfigStore(config(MMIO), missing=PveError(500, "missing"), mismatch="checksum mismatch")
    mappings = MappingStore(("gpu0", [LINE0]), ("gpu1", [LINE1]))
    agent = Agent(json.dumps(PASSED))
    tasks = "/nodes/pve1/tasks"
    api = FakeApi(
        {
            ("GET", f"{VMP}/config"): store.get,
            ("PUT", f"{VMP}/config"): store.put,
            ("GET", f"{VMP}/status/current"): {"vmid": 100, "status": "running", "qmpstatus": "running"},
            ("POST", f"{VMP}/status/shutdown"): UPID_SHUTDOWN,
            ("POST", f"{VMP}/status/start"): UPID_START1,
            ("GET", f"{tasks}/{UPID_SHUTDOWN}/status"): task_ok(UPID_SHUTDOWN),
            ("GET", f"{tasks}/{UPID_START1}/status"): task_ok(UPID_START1),
            **mappings.answers("gpu0", "gpu1"),
            **agent.answers(),
        }
    )
    commands, _ = clique_op(api, "probe")
    execute(commands)
    assert mappings.maps == {
        "gpu0": [LINE0.replace("0000:41:00,", "0000:41:00.0,")],
        "gpu1": [LINE1.replace("0000:61:00,", "0000:61:00.0,")],
    }
    assert store.values is not None
    assert store.values["args"] == f"{MMIO} {OURS}"
    assert [call[:2] for call in api.writes() if "/agent/" not in call[1]] == [
        ("PUT", "/cluster/mapping/pci/gpu0"),
        ("PUT", "/cluster/mapping/pci/gpu1"),
        ("PUT", f"{VMP}/config"),
        ("POST", f"{VMP}/status/shutdown"),
        ("POST", f"{VMP}/status/start"),
    ]
    assert json.loads(agent.files[RECORD_PATH])["verdict"] == "p2p"


def test_error_clique_refused_while_cpu_hides_the_hypervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.p2p.guest_in_run", lambda _host: False)
    values = {**config(MMIO), "cpu": "host,hidden=1"}
    store = ConfigStore(values, missing=PveError(500, "missing"), mismatch="checksum mismatch")
    agent = Agent()
    api = FakeApi(
        {
            ("GET", f"{VMP}/config"): store.get,
            ("GET", f"{VMP}/status/current"): {"vmid": 100, "status": "running", "qmpstatus": "running"},
            **agent.answers(),
        }
    )
    commands, _ = clique_op(api, "probe")
    with pytest.raises(OperationError) as error:
        execute(commands)
    assert str(error.value) == (
        "VM 100: cpu host,hidden=1 has hidden=1 (kvm=off), with which the guest's NVIDIA driver ignores the "
        "GPUDirect clique: not set (pvegpu's cpu value has no hidden; run deploy/vm.py again)"
    )
    assert [call for call in api.writes() if "/agent/" not in call[1]] == []
