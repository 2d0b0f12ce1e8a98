"""q35_vm: the Q35/OVMF VM with one `hostpciN: mapping=<prefix>N,pcie=1` per GPU, started; the check
that a started VM's guest sees its GPUs. Parking it for the `lxc` / `baremetal` profiles is
roles/guest_parked.py's.

The MMIO window is sized from the node's GPUs' BARs (plan/mmio.py); `vm.mmio = args` needs root@pam: an
API token's run writes it through root's pvesh on the node, and without a root path it was refused when the
inventory loaded. Starting is refused while the GPUs' functions are not bound
to vfio-pci on the node. With `vm.image` the VM gets its OS from a cloud image (roles/cloud_image.py); its
system disk is grown to `vm.disk.size_gib` and, once started, its guest must answer with the SSH host key
pvegpu gave it before the run goes on. A running VM's changes that Proxmox keeps pending until its next
cold start are applied by a cold restart when `pve_host.allow_reboot` allows it, else reported with the
command (pvegpu/operations/vm.py `vm_pending`). Last, GPU peer-to-peer in the VM as `vm.p2p` says (the clique
parts of `args`, the probe through the guest agent: pvegpu/operations/p2p.py).
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.facts.hardware import PciHardware
from pvegpu.inventory.validate import KNOWN_HOSTS_KEY
from pvegpu.local.create_records import ledger_beside
from pvegpu.operations.cloud_image import disk_grown
from pvegpu.operations.convert import q35_conversion
from pvegpu.operations.guest_known import GuestIdentity, guest_known, wait_until_answering
from pvegpu.operations.p2p import guest_venv, p2p_clique
from pvegpu.operations.pve_guest import VM, Guest, Ownership, guest_running, refuse_foreign
from pvegpu.operations.vm import guest_gpus, q35_vm, vm_pending
from pvegpu.plan.mmio import mmio_refusal
from pvegpu.plan.ownership import owner_id
from pvegpu.plan.p2p import clique_args, plan_cliques
from pvegpu.plan.vm import create_keys, unbound_functions, vm_config
from pvegpu.pve.host_client import pve_client
from pvegpu.run.plan import plan_of
from roles.cloud_image import cloud_image
from roles.self_heal import self_heal
from roles.snippets import storages_offer


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
    if plan.numa_problem is not None:
        raise OperationError(f"{host.name}: {plan.numa_problem}")
    refusal = mmio_refusal(spec.mmio, pve.root_user)
    if refusal is not None:
        raise OperationError(f"{host.name}: {refusal}")
    if plan.mmio is not None and plan.mmio.problem is not None:
        raise OperationError(f"{host.name}: vm.mmio: {plan.mmio.problem}")
    if plan.mmio is not None:
        logger.info(f"{host.print_prefix}VM {spec.vmid}: {plan.mmio.guest}")
    hardware, topology = plan.hardware, plan.topology
    api = pve_client(host)
    ownership = Ownership(owner_id(pve.owner, pve.cluster, node.name), spec.adopt, "vm.adopt")
    refuse_foreign(Guest(VM, api, node.name, spec.vmid), ownership)  # before anything of the run is written
    storages_offer(api, spec)
    identity = None if spec.image is None else cloud_image(api, node.name, spec, pve.task_timeout_s)
    self_heal(api, node, spec)  # the hookscript exists before the VM's config names it
    clique = clique_args(plan_cliques(topology, plan.cpu_vendor))
    config, create = vm_config(spec, plan.mapping_ids, plan.mmio, plan.numa, clique), create_keys(spec)
    converting = q35_conversion(  # an installed i440FX/SeaBIOS VM: moved only when its guest can boot on OVMF
        name="Convert an existing i440FX/SeaBIOS VM to Q35/OVMF",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        config=config,
        create=create,
        prefix=spec.mapping_prefix,
        timeout_s=pve.task_timeout_s,
        ownership=ownership,
    )
    converged = q35_vm(
        name="Create or converge the Q35 VM",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        config=config,
        create=create,
        prefix=spec.mapping_prefix,
        timeout_s=pve.task_timeout_s,
        # the identity the create runs as (root@pam when it carries a root-only key): its task's user
        ledger=ledger_beside(
            host.data.get(KNOWN_HOSTS_KEY),
            api.acts_as("POST", f"/nodes/{node.name}/qemu", {**config, **create}),
        ),
        keep_clique=spec.p2p == "probe",
        ownership=ownership,
    )
    disk_grown(
        name="The VM's system disk has its size",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        disk="scsi0",
        size_gib=spec.disk.size_gib,
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
        recheck=lambda target: unbound_functions(
            target.get_fact(PciHardware, sysfs_root=node.sysfs_root), topology
        ),
        after_start=_answering(identity, pve.task_timeout_s),
    )
    if identity is not None:
        guest_known(
            name="The guest's address and host key are known",
            identity=identity,
            api=api,
            node=node.name,
            vmid=spec.vmid,
            mac=None,
            timeout_s=pve.task_timeout_s,
        )
    probing = []
    if spec.p2p != "off":  # `off`: pvegpu's clique parts leave with the VM's config above
        probing = [
            p2p_clique(
                name="GPU peer-to-peer in the VM (vm.p2p)",
                api=api,
                node=node.name,
                vmid=spec.vmid,
                mode=spec.p2p,
                clique=clique,
                prefix=spec.mapping_prefix,
                venv=guest_venv(host),
                probe_timeout_s=spec.p2p_probe_timeout_s,
                timeout_s=pve.task_timeout_s,
            )
        ]
    # Last: the probe's own restart applies what is pending (choosing `probe` is the consent to it).
    vm_pending(
        name="Apply the VM's pending changes (a cold restart)",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        allow_restart=plan.specs.host.allow_reboot,
        config_changing=lambda: any(op.will_change for op in (converting, converged, *probing)),
        timeout_s=pve.task_timeout_s,
    )


def _answering(identity: GuestIdentity | None, timeout_s: float) -> Callable[[], None] | None:
    """After a start: wait until a guest with a static address answers with its host key (a DHCP guest's
    address comes from its agent, after the start: `guest_known`)."""
    if identity is None or identity.address is None:
        return None
    address = identity.address
    return lambda: wait_until_answering(identity, address, timeout_s)


@deploy("Verify the guest's GPUs")
def guest_check() -> None:
    """The guest's PCI bus shows as many NVIDIA GPUs as its `node.gpus.count` says (read-only)."""
    plan = plan_of(host)
    expected = plan.specs.node.gpus.count
    if expected is None:
        raise OperationError(f"{host.name}: node.gpus.count is not set: nothing to verify against")
    guest_gpus(name="Check the guest sees its GPUs", hardware=plan.hardware, expected=expected)
