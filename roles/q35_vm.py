"""q35_vm: the Q35/OVMF VM with one `hostpciN: mapping=<prefix>N,pcie=1` per GPU, started; the check
that a started VM's guest sees its GPUs. Parking it for the `lxc` / `baremetal` profiles is
roles/guest_parked.py's.

The MMIO window is sized from the node's GPUs' BARs (plan/mmio.py); `vm.mmio = args` needs root@pam, and
is refused up front for any other API user. Starting is refused while the GPUs' functions are not bound
to vfio-pci on the node.
"""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.facts.hardware import hardware_of
from pvegpu.facts.pve import pve_client
from pvegpu.host_plan import plan_of
from pvegpu.operations.pve_guest import VM, guest_running
from pvegpu.operations.vm import guest_gpus, q35_vm
from pvegpu.plan.mmio import mmio_refusal
from pvegpu.plan.vm import create_keys, unbound_functions, vm_config


@deploy("Create and start the Q35 VM")
def q35_vm_role() -> None:
    """Create or converge the VM's config, then start it and wait until it runs."""
    plan = plan_of(host)
    node, spec, pve = plan.specs.node, plan.specs.vm, plan.specs.pve
    if spec is None:
        raise OperationError(f"{host.name}: profile vm needs `vm` data (the VM: vmid, name, cores, memory)")
    problem = plan.passable_problem()
    if problem is not None:
        raise OperationError(f"{host.name}: the GPUs cannot be passed: {problem}")
    refusal = mmio_refusal(spec.mmio, pve.api_user)
    if refusal is not None:
        raise OperationError(f"{host.name}: {refusal}")
    hardware, topology = plan.hardware, plan.topology
    api = pve_client(host)
    q35_vm(
        name="Create or converge the Q35 VM",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        config=vm_config(spec, plan.mapping_ids, plan.mmio),
        create=create_keys(spec),
        prefix=spec.mapping_prefix,
        timeout_s=pve.task_timeout_s,
    )
    guest_running(
        name="Start the VM and wait until it runs",
        kind=VM,
        api=api,
        node=node.name,
        vmid=spec.vmid,
        unbound=unbound_functions(hardware, topology),
        timeout_s=pve.task_timeout_s,
        # deploy/site.py may reboot the host into vfio binding earlier in the same run: read it again then.
        recheck=lambda target: unbound_functions(hardware_of(target, node.sysfs_root), topology),
    )


@deploy("Verify the guest's GPUs")
def guest_check() -> None:
    """The guest's PCI bus shows as many NVIDIA GPUs as its `node.gpus.count` says (read-only)."""
    plan = plan_of(host)
    expected = plan.specs.node.gpus.count
    if expected is None:
        raise OperationError(f"{host.name}: node.gpus.count is not set: nothing to verify against")
    guest_gpus(name="Check the guest sees its GPUs", hardware=plan.hardware, expected=expected)
