"""`plan_failures`: every planner error, of whichever planner, stops the host as one OperationError text."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.plan.errors import PlanError
from pvegpu.plan.hostpci import HostPciError
from pvegpu.plan.mapping import MappingPlanError
from pvegpu.run.plan import plan_failures


class _Named:
    name = "pve1"


HOST = _Named()


@pytest.mark.parametrize(
    ("error", "what", "text"),
    [
        (
            PlanError("sglang.env: NCCL_P2P_DISABLE=0 enables P2P"),
            "",
            "pve1: sglang.env: NCCL_P2P_DISABLE=0 enables P2P",
        ),
        (
            HostPciError("hostpci3: pcie=1 needs a q35 machine"),
            "",
            "pve1: hostpci3: pcie=1 needs a q35 machine",
        ),
        (
            MappingPlanError(
                ["gpu0: 0000:41:00.0 shares group 7 with 0000:42:00.0 (NVMe)", "gpu1: no group"]
            ),
            "cannot map the GPUs:\n",
            "pve1: cannot map the GPUs:\n"
            "gpu0: 0000:41:00.0 shares group 7 with 0000:42:00.0 (NVMe)\ngpu1: no group",
        ),
    ],
)
def test_a_planner_error_becomes_one_operation_error_naming_the_host(
    error: PlanError, what: str, text: str
) -> None:
    with pytest.raises(OperationError) as raised, plan_failures(HOST, what):  # type: ignore[arg-type]
        raise error
    assert str(raised.value) == text
    assert raised.value.__cause__ is None


def test_other_errors_pass_through_unchanged() -> None:
    with pytest.raises(KeyError), plan_failures(HOST):  # type: ignore[arg-type]
        raise KeyError("not a plan's")


def test_the_planner_errors_are_one_family() -> None:
    assert issubclass(HostPciError, PlanError)
    assert issubclass(MappingPlanError, PlanError)
