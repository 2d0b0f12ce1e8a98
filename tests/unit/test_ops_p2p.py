"""`p2p_clique` (pvegpu/operations/p2p.py) against a scripted Proxmox API: `on` changes nothing and warns;
the probe's agent exec is bounded by its deadline (a hang returns no exit status), each way a probe run ends
becomes the documented verdict, and nothing restarts while the run also converges the guest."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from pvegpu.operations.p2p import Exec, _judged, guest_exec, guest_in_run, p2p_clique
from pvegpu.operations.pve_guest import VM, Guest
from pvegpu.plan.p2p import timeout_failure
from tests.unit.fake_pve import FakeApi
from tests.unit.op_harness import run_op

VMP = "/nodes/pve1/qemu/100"
MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"
OPERATOR = "-set device.hostpci0.x-nv-gpudirect-clique=0"
OURS = "-set device.hostpci0.0.x-nv-gpudirect-clique=0 -set device.hostpci1.0.x-nv-gpudirect-clique=0"


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
        api=api.client,
        node="pve1",
        vmid=100,
        mode=mode,
        clique=OURS,
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
