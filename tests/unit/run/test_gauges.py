"""The values of pvegpu's textfiles (pvegpu/run/gauges.py), from a host's plan and its one state read: what
each gauge says for a state, and that the same state gives the same bytes (a second run writes nothing)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from pvegpu.facts.sglang import Probe
from pvegpu.models.boot import CpuKernel, KernelBoot
from pvegpu.models.groups import PVE_NODES, VM_GUESTS
from pvegpu.models.model_store import StoreFile, record_path
from pvegpu.models.p2p import Identity, Record
from pvegpu.models.specs import host_specs
from pvegpu.plan.gauges import ModelValue, NextBootValue, P2pValue, node_file, serving_file
from pvegpu.plan.node import NodeObserved, NodePlan, plan_node
from pvegpu.run import gauges
from tests.unit.host_states import host_state
from tests.unit.hostdata import RTX, two_cards

MODEL = "/srv/models/m"
SGLANG = {"model_path": MODEL, "model_repo": "org/m", "model_revision": "abc"}
DRIVER = "590.48.01"
WEIGHTS = StoreFile(10, 1_700_000_000_000_000_000)
RECORD = json.dumps(
    {
        "repo": "org/m",
        "revision": "abc",
        "commit": "c" * 40,
        "complete": True,
        "files": {"model.safetensors": {"size": 10, "mtime_ns": WEIGHTS.mtime_ns}},
    }
)


def plan(group: str, profile: str) -> NodePlan:
    data: dict[str, Any] = {
        "node": {"name": "llm", "profile": profile, "gpus": {"ids": [RTX], "count": 2}},
        "driver": {"version": DRIVER},
        "sglang": SGLANG,
    }
    if group == PVE_NODES and profile == "vm":
        data["vm"] = {"vmid": 100}
    observed = NodeObserved(two_cards(), CpuKernel("amd", (6, 8)) if group == PVE_NODES else None)
    return plan_node("llm", host_specs(data), frozenset({group}), observed)


@pytest.fixture
def decide(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`decide(plan, state, p2p)`: run/gauges sees `plan`, `state` and the node's `vm.p2p` `p2p`."""

    def set_(plan: NodePlan, state: object, p2p: str | None = None) -> None:
        monkeypatch.setattr(gauges, "plan_of", lambda _host: plan)
        monkeypatch.setattr(gauges, "state_of", lambda _host: state)
        monkeypatch.setattr(gauges, "node_p2p", lambda _host: p2p)

    return set_


def test_vm_guest_serving_verified_model_p2p_probe_shm_driver_module_for_next_kernel(decide: Any) -> None:
    boot = KernelBoot("6.1.0-28-amd64", ("6.1.0-28-amd64",), None, None, {"6.1.0-28-amd64": (DRIVER,)})
    record = Record("probe", "shm", Identity(DRIVER, "6.1.0-28-amd64", "hostpci0=x"))
    state = replace(
        host_state(),
        probe=Probe(True, "glm-5"),
        records={record_path(MODEL): RECORD},
        store={"model.safetensors": WEIGHTS},
        p2p_record=record,
        next_boot=boot,
    )
    decide(plan(VM_GUESTS, "vm"), state, "probe")
    assert gauges.serving_gauges(None) == serving_file(  # type: ignore[arg-type]
        model=ModelValue(MODEL, "org/m", "abc", complete=True),
        p2p=P2pValue("probe", used=False, record=("probe", "shm")),
        next_boot=NextBootValue("6.1.0-28-amd64", DRIVER, ready=True),
    )


def test_vm_guest_not_answering_model_changed_new_kernel_without_module(decide: Any) -> None:
    boot = KernelBoot(
        "6.1.0-28-amd64", ("6.1.0-28-amd64", "6.1.0-30-amd64"), None, None, {"6.1.0-28-amd64": (DRIVER,)}
    )
    state = replace(
        host_state(),
        probe=Probe(False, "HTTP 503"),
        records={record_path(MODEL): RECORD},
        store={"model.safetensors": replace(WEIGHTS, size=9)},
        next_boot=boot,
    )
    decide(plan(VM_GUESTS, "vm"), state, "off")
    assert gauges.serving_gauges(None) == serving_file(  # type: ignore[arg-type]
        model=ModelValue(MODEL, "org/m", "abc", complete=False),
        p2p=P2pValue("off", used=False),
        next_boot=NextBootValue("6.1.0-30-amd64", DRIVER, ready=False),
    )


def test_vm_guest_before_its_driver_no_probe_no_record_no_next_boot(decide: Any) -> None:
    """No module built anywhere: the driver is not installed yet, so nothing is said of the next boot; a
    probe that did not run is not an answer; no record of a fetch is not complete."""
    boot = KernelBoot("6.1.0-28-amd64", ("6.1.0-28-amd64",), None, None, {})
    decide(plan(VM_GUESTS, "vm"), replace(host_state(), next_boot=boot), None)
    assert gauges.serving_gauges(None) == serving_file(  # type: ignore[arg-type]
        model=ModelValue(MODEL, "org/m", "abc", complete=False)
    )


def test_vm_node_file_is_empty_its_mappings_are_the_timers(decide: Any) -> None:
    decide(plan(PVE_NODES, "vm"), host_state())
    assert gauges.node_gauges(None) == ""  # type: ignore[arg-type]


def test_baremetal_node_next_boot_of_the_host_driver(decide: Any) -> None:
    boot = KernelBoot(
        "6.8.12-4-pve", ("6.8.12-4-pve", "7.0.2-1-pve"), None, None, {"6.8.12-4-pve": (DRIVER,)}
    )
    decide(plan(PVE_NODES, "baremetal"), replace(host_state(), next_boot=boot))
    assert gauges.node_gauges(None) == node_file(  # type: ignore[arg-type]
        NextBootValue("7.0.2-1-pve", DRIVER, ready=False)
    )


def test_the_same_state_gives_the_same_bytes(decide: Any) -> None:
    state = replace(host_state(), probe=Probe(True, "glm-5"))
    decide(plan(VM_GUESTS, "vm"), state, "on")
    first = gauges.serving_gauges(None)  # type: ignore[arg-type]
    assert first == gauges.serving_gauges(None)  # type: ignore[arg-type]
    assert 'pvegpu_p2p_enabled{mode="on"} 1\n' in first
    assert "pvegpu_sglang_ready" not in first  # the timer's (pvegpu_sglang.prom)
