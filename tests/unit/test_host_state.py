"""`state_request` (pvegpu/host_state.py): what a serving host's one state read asks for beyond the roles'
paths: the initramfs images older than the nouveau blacklist where the driver's module is installed, and the
P2P probe's record only where the guest's node has `vm.p2p` other than `off`."""

from __future__ import annotations

from pvegpu.host_state import state_request
from pvegpu.models.groups import LXC_GUESTS, VM_GUESTS
from pvegpu.models.specs import host_specs
from pvegpu.plan.node import NodeObserved, NodePlan, plan_node
from tests.unit.hostdata import RTX, two_cards


def serving_plan(group: str, profile: str) -> NodePlan:
    specs = host_specs({"node": {"name": "llm", "profile": profile, "gpus": {"ids": [RTX], "count": 2}}})
    return plan_node("llm", specs, frozenset({group}), NodeObserved(two_cards()))


def test_the_p2p_record_is_read_only_when_vm_p2p_is_not_off() -> None:
    guest = serving_plan(VM_GUESTS, "vm")
    assert [state_request(guest, mode).records for mode in (None, "off", "probe", "on")] == [
        (),
        (),
        ("/var/lib/pvegpu/p2p-probe.json",),
        ("/var/lib/pvegpu/p2p-probe.json",),
    ]


def test_initramfs_images_are_checked_where_the_driver_blacklists_nouveau() -> None:
    assert (
        state_request(serving_plan(VM_GUESTS, "vm")).initramfs_after == "/etc/modprobe.d/pvegpu-nouveau.conf"
    )
    assert state_request(serving_plan(LXC_GUESTS, "lxc")).initramfs_after is None  # the host's module
