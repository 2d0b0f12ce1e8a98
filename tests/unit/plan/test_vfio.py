"""plan.vfio (which functions, ids or addresses, modules per kernel) and plan.reboot (what is pending)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pvegpu.models.hardware import HostHardware
from pvegpu.models.node import GpuSelector
from pvegpu.plan.errors import PlanError
from pvegpu.plan.reboot import pending_message, pending_reasons
from pvegpu.plan.topology import plan_topology, require_gpus
from pvegpu.plan.vfio import BLACKLIST_VM, VfioPlan, plan_vfio, selected_functions
from tests.unit.hostdata import AUDIO, RTX, two_cards

BOTH = ("0000:41:00.0", "0000:41:00.1", "0000:51:00.0", "0000:51:00.1")


def test_selected_functions_are_each_groups_non_bridge_members() -> None:
    hw = two_cards()
    assert selected_functions(hw, plan_topology(hw, GpuSelector(ids=(RTX,), count=2))) == BOTH


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        (
            GpuSelector(ids=("10de:ffff",)),
            "node.gpus.ids: 10de:ffff matches no display function on this host",
        ),
        (
            GpuSelector(ids=(RTX,), count=8),
            "node.gpus.count: expected 8 GPUs with id 10de:2bb1, found 2",
        ),
    ],
)
def test_error_selector_names_the_field(selector: GpuSelector, message: str) -> None:
    with pytest.raises(PlanError) as raised:
        require_gpus(plan_topology(two_cards(), selector), selector)
    assert str(raised.value) == message


def test_error_group_shared_with_an_endpoint_is_refused() -> None:
    hw = two_cards()
    nic = replace(hw.by_address["0000:61:00.0"], iommu_group=14)
    shared = HostHardware(tuple(nic if f.address == nic.address else f for f in hw.functions), True)
    with pytest.raises(PlanError) as raised:
        selected_functions(shared, plan_topology(shared, GpuSelector(ids=(RTX,))))
    assert str(raised.value).startswith("node.gpus: gpu0 (0000:41:00): ")
    assert "0000:61:00.0" in str(raised.value)


@pytest.mark.parametrize(
    ("kernel", "modules"),
    [
        ((6, 1), ("vfio", "vfio_iommu_type1", "vfio_pci", "vfio_virqfd")),
        ((6, 2), ("vfio", "vfio_iommu_type1", "vfio_pci")),
        ((6, 8), ("vfio", "vfio_iommu_type1", "vfio_pci")),
    ],
)
def test_every_card_selected_binds_by_ids(kernel: tuple[int, int], modules: tuple[str, ...]) -> None:
    assert plan_vfio(two_cards(), BOTH, kernel) == VfioPlan(
        functions=BOTH,
        modules=modules,
        ids=(AUDIO, RTX),
        addresses=(),
        softdeps=("nouveau", "nvidia"),
        blacklist=BLACKLIST_VM,
    )


def test_some_of_several_identical_cards_bind_by_address() -> None:
    one = ("0000:41:00.0", "0000:41:00.1")
    plan = plan_vfio(two_cards(), one, (6, 8))
    assert (plan.ids, plan.addresses) == ((), one)


def test_pending_message_as_operators_read_it() -> None:
    hw = two_cards()
    reasons = pending_reasons(("root=/dev/x", "amd_iommu=on"), ("amd_iommu=on", "iommu=pt"), hw, BOTH[:1])
    assert pending_message(reasons) == (
        "reboot required: /proc/cmdline lacks iommu=pt; 0000:41:00.0 still bound to nvidia"
    )


def test_pending_lists_every_reason_in_order() -> None:
    hw = HostHardware((*two_cards(driver=None, iommu=False).functions[:3],), iommu_present=False)
    reasons = pending_reasons((), ("intel_iommu=on", "iommu=pt"), hw, ("0000:41:00.0", "0000:42:00.0"))
    assert reasons == (
        "/proc/cmdline lacks intel_iommu=on iommu=pt",
        "the IOMMU is off (no IOMMU groups)",
        "0000:41:00.0 bound to no driver",
        "0000:42:00.0 missing",
    )


def test_functions_in_the_same_state_share_a_clause() -> None:
    reasons = pending_reasons(("amd_iommu=on", "iommu=pt"), ("amd_iommu=on", "iommu=pt"), two_cards(), BOTH)
    assert reasons == (
        "0000:41:00.0, 0000:51:00.0 still bound to nvidia",
        "0000:41:00.1, 0000:51:00.1 still bound to snd_hda_intel",
    )


def test_nothing_pending_once_booted_into_the_new_state() -> None:
    hw = two_cards(driver="vfio-pci")
    assert (
        pending_reasons(("quiet", "amd_iommu=on", "iommu=pt"), ("amd_iommu=on", "iommu=pt"), hw, BOTH) == ()
    )
