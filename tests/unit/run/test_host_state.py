"""`state_request` (pvegpu/run/host_state.py): what a serving host's one state read asks for beyond the roles'
paths: the initramfs images older than the nouveau blacklist where the driver's module is installed, and the
P2P probe's record only where the guest's node has `vm.p2p` other than `off`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from pyinfra.api.host import Host

from pvegpu.facts.hardware import PciHardware
from pvegpu.facts.host_read import HostRead
from pvegpu.facts.serving_read import ServingRead, ServingState
from pvegpu.models.groups import LXC_GUESTS, VM_GUESTS
from pvegpu.models.specs import host_specs
from pvegpu.plan.node import NodeObserved, NodePlan, plan_node
from pvegpu.run.host_state import read_serving_host, state_of, state_request, unchanged_state
from pvegpu.run.plan import plan_of
from tests.unit.host_states import host_state
from tests.unit.hostdata import RTX, two_cards
from tests.unit.op_harness import FakeState


def serving_plan(group: str, profile: str) -> NodePlan:
    specs = host_specs({"node": {"name": "llm", "profile": profile, "gpus": {"ids": [RTX], "count": 2}}})
    return plan_node("llm", specs, frozenset({group}), NodeObserved(two_cards()))


def test_the_p2p_record_is_read_only_when_vm_p2p_is_not_off() -> None:
    guest = serving_plan(VM_GUESTS, "vm")
    conf = (
        "/var/lib/sglang/.nccl.conf",  # NCCL's conf files, read in a VM only
        "/etc/nccl.conf",
        "/models/GLM-5-NVFP4/config.json",  # the checkpoint's, for sglang.recipe
        "/models/GLM-5-NVFP4/hf_quant_config.json",
        "/run/pvegpu-sglang.started",  # what SGLang started from (pvegpu/plan/sglang_started.py)
    )
    assert [state_request(guest, mode).records for mode in (None, "off", "probe", "on")] == [
        conf,
        conf,
        ("/var/lib/pvegpu/p2p-probe.json", *conf),
        ("/var/lib/pvegpu/p2p-probe.json", *conf),
    ]
    assert state_request(guest, None).weight_index == "/models/GLM-5-NVFP4/model.safetensors.index.json"
    assert state_request(serving_plan(LXC_GUESTS, "lxc"), "probe").records == (
        "/var/lib/pvegpu/p2p-probe.json",
        *conf[2:],
    )


def test_initramfs_images_are_checked_where_the_driver_blacklists_nouveau() -> None:
    assert (
        state_request(serving_plan(VM_GUESTS, "vm")).initramfs_after == "/etc/modprobe.d/pvegpu-nouveau.conf"
    )
    assert state_request(serving_plan(LXC_GUESTS, "lxc")).initramfs_after is None  # the host's module


class ServingHost:
    """A VM guest of no node in this run: each fact it is asked for is recorded and answered."""

    name = "llm"
    groups = (VM_GUESTS,)

    def __init__(self) -> None:
        self.data: dict[str, Any] = {
            "node": {
                "name": "llm",
                "profile": "vm",
                "gpus": {"ids": [RTX], "count": 2},
                "sysfs_root": "/opt/s",
            }
        }
        self.state = FakeState(self, diff=False)
        self.facts: list[tuple[type, dict[str, Any]]] = []
        self.read = ServingState(two_cards(), host_state())

    def get_fact(self, fact: type, **kwargs: Any) -> object:
        self.facts.append((fact, kwargs))
        answers: dict[type, object] = {
            ServingRead: self.read,
            HostRead: host_state(),
            PciHardware: two_cards(),
        }
        return answers[fact]

    def ran_an_operation(self) -> None:
        meta = SimpleNamespace(is_complete=lambda: True, executed=True)
        self.state.ops[self][f"op{len(self.state.ops[self])}"] = SimpleNamespace(operation_meta=meta)


def test_a_serving_host_is_read_once_for_its_plan_and_its_operations() -> None:
    guest = ServingHost()
    target = cast(Host, guest)
    read_serving_host(target)
    read_serving_host(target)  # already read
    plan = plan_of(target)
    assert state_of(target) is guest.read.state
    assert plan.hardware is guest.read.hardware
    assert guest.facts == [(ServingRead, {"sysfs_root": "/opt/s", "request": state_request(plan)})]
    guest.ran_an_operation()  # after a change the state is read on its own
    assert state_of(target) == host_state()
    assert [fact for fact, _ in guest.facts] == [ServingRead, HostRead]


def test_a_planned_host_is_not_read_together() -> None:
    guest = ServingHost()
    target = cast(Host, guest)
    plan_of(target)
    read_serving_host(target)
    state_of(target)
    assert [fact for fact, _ in guest.facts] == [PciHardware, HostRead]


def test_the_unchanged_state_is_the_read_until_a_change() -> None:
    guest = ServingHost()
    target = cast(Host, guest)
    assert unchanged_state(target) is None  # not read yet: nothing is read here
    read_serving_host(target)
    assert unchanged_state(target) is guest.read.state
    guest.ran_an_operation()
    assert unchanged_state(target) is None
    assert [fact for fact, _ in guest.facts] == [ServingRead]


def test_a_serving_host_reads_the_exporter_its_gauges_and_where_the_module_is_the_next_boot() -> None:
    """The node exporter's operations and the gauges decide from this one read (pvegpu/run/exporter.py):
    nothing of theirs is read on its own on a serving host."""
    guest, container = (
        state_request(serving_plan(VM_GUESTS, "vm")),
        state_request(serving_plan(LXC_GUESTS, "lxc")),
    )
    for request in (guest, container):
        assert "/var/lib/prometheus/node-exporter/pvegpu_serving.prom" in request.paths
        assert "prometheus-node-exporter.service" in request.units
    assert (guest.next_boot, container.next_boot) == (True, False)  # a container has no module of its own
