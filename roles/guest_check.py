"""guest_check: after deploy/rebuild_vm.py repaired the mappings and started the VM, the guest's PCI bus shows
its GPUs (read-only: pvegpu/operations/vm.py `guest_gpus`, from the guest's plan)."""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.operations.vm import guest_gpus
from pvegpu.run.plan import plan_of


@deploy("Verify the guest's GPUs")
def guest_check() -> None:
    """The guest's PCI bus shows as many NVIDIA GPUs as its `node.gpus.count` says (read-only)."""
    plan = plan_of(host)
    expected = plan.specs.node.gpus.count
    if expected is None:
        raise OperationError(f"{host.name}: node.gpus.count is not set: nothing to verify against")
    guest_gpus(name="Check the guest sees its GPUs", hardware=plan.hardware, expected=expected)
