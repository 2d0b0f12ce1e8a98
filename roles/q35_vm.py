"""q35_vm: the Q35/OVMF VM with one `hostpciN: mapping=<prefix>N,pcie=1` per GPU, started; the check
that a started VM's guest sees its GPUs; and, for the `lxc` / `baremetal` profiles, the VM stopped with
`onboot: 0` (`q35_vm_parked`).

The MMIO window is sized from the node's GPUs' BARs (plan/mmio.py); `vm.mmio = args` needs root@pam, and
is refused up front for any other API user. Starting is refused while the GPUs' functions are not bound
to vfio-pci on the node.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.facts.hardware import hardware_of
from pvegpu.facts.pve import api_spec, pve_client
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.inventory import spec_of
from pvegpu.models.vm import VM_KEY, VmSpec
from pvegpu.operations.vm import guest_gpus, q35_vm, vm_running
from pvegpu.operations.vm_parked import vm_parked
from pvegpu.plan.mapping import mapping_id
from pvegpu.plan.mmio import mmio_refusal, passed_functions, plan_mmio
from pvegpu.plan.topology import plan_topology
from pvegpu.plan.vm import create_keys, unbound_functions, vm_config
from roles.pci_mapping import node_of


@deploy("Create and start the Q35 VM")
def q35_vm_role() -> None:
    """Create or converge the VM's config, then start it and wait until it runs."""
    node = node_of(host)
    spec = spec_of(host.data, VM_KEY, VmSpec)
    pve = api_spec(host.data)
    hardware = hardware_of(host, node.sysfs_root)
    topology = plan_topology(hardware, node.gpus)
    if not topology.ok:
        problems = [*topology.problems, *(f"{g.name}: {g.reason}" for g in topology.gpus if g.reason)]
        raise OperationError(f"{host.name}: the GPUs cannot be passed: {'; '.join(problems)}")
    refusal = mmio_refusal(spec.mmio, pve.api_user)
    if refusal is not None:
        raise OperationError(f"{host.name}: {refusal}")
    try:
        window = plan_mmio(passed_functions(hardware, topology.gpus), spec.memory)
    except ValueError:
        window = None  # no 64-bit prefetchable BAR: OVMF's default aperture is enough
    ids = [mapping_id(spec.mapping_prefix, index) for index in range(len(topology.gpus))]
    api = pve_client(host)
    q35_vm(
        name="Create or converge the Q35 VM",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        config=vm_config(spec, ids, window),
        create=create_keys(spec),
        prefix=spec.mapping_prefix,
        timeout_s=pve.task_timeout_s,
    )
    vm_running(
        name="Start the VM and wait until it runs",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        unbound=unbound_functions(hardware, topology),
        timeout_s=pve.task_timeout_s,
        # deploy/site.py may reboot the host into vfio binding earlier in the same run: read it again then.
        recheck=lambda target: unbound_functions(hardware_of(target, node.sysfs_root), topology),
    )


@deploy("Stop the Q35 VM for a host-driver profile")
def q35_vm_parked() -> None:
    """`lxc` / `baremetal`: the managed VM stopped (when `pve_host.allow_reboot`) and `onboot: 0`.

    A host without `vm` data has no managed VM: nothing to do.
    """
    node = node_of(host)
    if host.data.get(VM_KEY) is None:
        logger.info(f"{host.print_prefix}no `vm` data: no managed VM to stop for profile {node.profile}")
        return
    spec = spec_of(host.data, VM_KEY, VmSpec)
    allow = spec_of(host.data, HOST_KEY, HostSpec)
    vm_parked(
        name="Stop the VM and keep it from starting at boot",
        api=pve_client(host),
        node=node.name,
        vmid=spec.vmid,
        prefix=spec.mapping_prefix,
        profile=node.profile,
        allow_stop=allow.allow_reboot,
        timeout_s=api_spec(host.data).task_timeout_s,
    )


@deploy("Verify the guest's GPUs")
def guest_check() -> None:
    """The guest's PCI bus shows as many NVIDIA GPUs as its `node.gpus.count` says (read-only)."""
    node = node_of(host)
    if node.gpus.count is None:
        raise OperationError(f"{host.name}: node.gpus.count is not set: nothing to verify against")
    hardware = hardware_of(host, node.sysfs_root)
    guest_gpus(name="Check the guest sees its GPUs", hardware=hardware, expected=node.gpus.count)
