"""q35_vm: the Q35/OVMF VM with one `hostpciN: mapping=<prefix>N,pcie=1` per GPU, started. Parking it for the
`lxc` / `baremetal` profiles is roles/guest_parked.py's; the check that a started VM's guest sees its GPUs,
roles/guest_check.py's.

The VM's config, create keys, GPUDirect cliques and storages come from the node's plan (plan/vm.py `VmPlan`,
`plan_of(host).vm`). The MMIO window is sized from the node's GPUs' BARs (plan/mmio.py); `vm.mmio = args`
needs root@pam: an API token's run writes it through root's pvesh on the node, and without a root path it
was refused when the inventory loaded. Starting is refused while the GPUs' functions are not bound to
vfio-pci on the node. With `vm.image` the VM gets its OS from a cloud image (pvegpu/operations/cloud_image.py
`cloud_image`); its system disk is grown to `vm.disk.size_gib` and, once started, its guest must answer with
the SSH host key pvegpu gave it before the run goes on. A running VM's changes that Proxmox keeps pending
until its next cold start are applied by a cold restart when `pve_host.allow_reboot` allows it, else
reported with the command (pvegpu/operations/vm.py `vm_pending`). Last, GPU peer-to-peer in the VM as
`vm.p2p` says (the clique parts of `args`, the probe through the guest agent: pvegpu/operations/p2p.py).
With `model` data the VM gets the node's model store as `virtiofs0: pvegpu-models`, the cluster directory
mapping `pvegpu-models` mapping this node to the store (pvegpu/plan/model_share.py,
pvegpu/operations/mapping_dir.py); on a qemu-server without virtiofs (before 8.3.11) neither, and the run
says so.
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import OperationMeta
from pyinfra.context import host

from pvegpu.operations.cloud_image import cloud_image, disk_grown, storages_offer
from pvegpu.operations.convert import q35_conversion
from pvegpu.operations.guest_known import GuestIdentity, guest_known, wait_until_answering
from pvegpu.operations.hook import self_heal
from pvegpu.operations.mapping_dir import model_share_mapping, refuse_foreign_share
from pvegpu.operations.p2p import p2p_clique
from pvegpu.operations.pve_guest import VM, Guest, Ownership, guest_running, refuse_foreign
from pvegpu.operations.vm import q35_vm, vm_pending
from pvegpu.plan.node import NodePlan
from pvegpu.plan.vm import VmPlan
from pvegpu.pve.client import PveClient
from pvegpu.pve.host_client import pve_client
from pvegpu.run.plan import guest_venv, plan_of, unbound_now
from pvegpu.run.vm import create_ledger


@deploy("Create and start the Q35 VM")
def q35_vm_role() -> None:
    """Create or converge the VM's config, then start it and wait until it runs."""
    plan = plan_of(host)
    vm, node, pve = _vm_plan(plan), plan.specs.node, plan.specs.pve
    spec, timeout_s = vm.spec, pve.task_timeout_s
    api = pve_client(host)
    ownership = Ownership(plan.owner, spec.adopt, "vm.adopt")
    guest = Guest(VM, api, node.name, spec.vmid)  # the one value every operation below acts on
    refuse_foreign(guest, ownership)  # before anything of the run is written
    _model_share(vm, api, node.name, plan.owner)
    storages_offer(api, vm.storages)
    identity = None if spec.image is None else cloud_image(guest, spec, timeout_s)
    self_heal(api, node, spec, ownership.owner)  # the hookscript exists before the VM's config names it
    if vm.share is not None:  # before the VM's start, which needs this node's line (its virtiofs0)
        model_share_mapping(
            name="Map the model store for the VM (directory mapping)",
            api=api,
            share=vm.share,
            node=node.name,
            owner=plan.owner,
        )
    configs = _config(vm, guest, ownership, timeout_s)
    guest_running(
        name="Start the VM and wait until it runs",
        guest=guest,
        unbound=vm.unbound,
        timeout_s=timeout_s,
        recheck=unbound_now,  # deploy/site.py may reboot the host into vfio binding earlier in the same run
        after_start=_answering(identity, timeout_s),
    )
    if identity is not None:
        guest_known(
            name="The guest's address and host key are known",
            identity=identity,
            guest=guest,
            mac=None,
            timeout_s=timeout_s,
        )
    changing = (*configs, *_p2p(vm, guest, timeout_s))
    # Last: the probe's own restart applies what is pending (choosing `probe` is the consent to it).
    vm_pending(
        name="Apply the VM's pending changes (a cold restart)",
        guest=guest,
        allow_restart=plan.specs.host.allow_reboot,
        config_changing=lambda: any(op.will_change for op in changing),
        timeout_s=timeout_s,
    )


def _vm_plan(plan: NodePlan) -> VmPlan:
    """The node's VM plan; OperationError, while operations are collected, without `vm` data or when the VM
    cannot be made (`VmPlan.problem`). Says which MMIO window the guest gets."""
    vm = plan.vm
    if vm is None:
        raise OperationError(f"{host.name}: profile vm needs `vm` data (the VM: vmid, name, cores, memory)")
    if vm.problem is not None:
        raise OperationError(f"{host.name}: {vm.problem}")
    if plan.mmio is not None:
        logger.info(f"{host.print_prefix}VM {vm.spec.vmid}: {plan.mmio.guest}")
    return vm


def _model_share(vm: VmPlan, api: PveClient, node: str, owner: str) -> None:
    """With `model` data: a directory mapping `pvegpu-models` pvegpu did not make is refused before anything
    of the run is written; on a qemu-server without virtiofs the run says so (the guest fetches the
    model)."""
    if vm.share is not None:
        refuse_foreign_share(api, vm.share, node, owner)
    elif vm.share_note is not None:
        logger.info(f"{host.print_prefix}{vm.share_note}")


def _config(vm: VmPlan, guest: Guest, ownership: Ownership, timeout_s: float) -> tuple[OperationMeta, ...]:
    """An installed i440FX/SeaBIOS VM converted (only when its guest can boot on OVMF), the VM created or
    converged to the plan's config, its system disk grown: the two config operations."""
    converting = q35_conversion(
        name="Convert an existing i440FX/SeaBIOS VM to Q35/OVMF",
        guest=guest,
        vm=vm,
        timeout_s=timeout_s,
        ownership=ownership,
    )
    converged = q35_vm(
        name="Create or converge the Q35 VM",
        guest=guest,
        vm=vm,
        timeout_s=timeout_s,
        ledger=create_ledger(host),
        ownership=ownership,
    )
    disk_grown(
        name="The VM's system disk has its size",
        guest=guest,
        disk="scsi0",
        size_gib=vm.spec.disk.size_gib,
    )
    return converting, converged


def _p2p(vm: VmPlan, guest: Guest, timeout_s: float) -> tuple[OperationMeta, ...]:
    """GPU peer-to-peer in the VM as `vm.p2p` says (the probe's operation); none with `off`, whose clique
    parts leave with the VM's config."""
    spec = vm.spec
    if spec.p2p == "off":
        return ()
    probing = p2p_clique(
        name="GPU peer-to-peer in the VM (vm.p2p)",
        guest=guest,
        mode=spec.p2p,
        clique=vm.clique,
        prefix=spec.mapping_prefix,
        venv=guest_venv(host),
        probe_timeout_s=spec.p2p_probe_timeout_s,
        timeout_s=timeout_s,
    )
    return (probing,)


def _answering(identity: GuestIdentity | None, timeout_s: float) -> Callable[[], None] | None:
    """After a start: wait until a guest with a static address answers with its host key (a DHCP guest's
    address comes from its agent, after the start: `guest_known`)."""
    if identity is None or identity.address is None:
        return None
    address = identity.address
    return lambda: wait_until_answering(identity, address, timeout_s)
