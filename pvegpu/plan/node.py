"""One plan per host and run: `plan_node(specs, groups, observed) -> NodePlan`. Pure.

Everything the roles need to decide, derived once from the host's validated specs, its inventory groups and
what was observed (the PCI hardware; on a Proxmox node also the CPU vendor and kernel release): the GPU
topology, the profile's GPU functions, the PCI mapping ids, the vfio, MMIO and VM NUMA plans, the VM's plan
(plan/vm.py `VmPlan`: its config, create keys, GPUDirect cliques, storages, the model store's share), a
node's reboot guard (plan/reboot.py) and the profile's steps (what to park, what waits and why). Roles read
the plan (`pvegpu.run.plan.plan_of(host)`) and never derive any of it again. What cannot be planned is kept as
`problem` (a `path: message` sentence naming the inventory field) and raised by the first role that needs the
missing part, before any host is changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pvegpu.models.boot import CpuKernel
from pvegpu.models.groups import PVE_NODES
from pvegpu.models.hardware import HostHardware
from pvegpu.models.specs import HostSpecs
from pvegpu.plan.cmdline import retired_tokens
from pvegpu.plan.errors import PlanError
from pvegpu.plan.mapping import DEFAULT_PREFIX, mapping_id
from pvegpu.plan.mmio import MmioWindow, passed_functions, plan_mmio
from pvegpu.plan.numa import NumaPlan, plan_numa
from pvegpu.plan.ownership import owner_id
from pvegpu.plan.profile import (
    HostProfile,
    NodeSteps,
    ServingSteps,
    held_by_vfio,
    host_profile,
    node_steps,
    profile_functions,
    serving_steps,
)
from pvegpu.plan.reboot import RebootGuard, reboot_guard
from pvegpu.plan.topology import Topology, plan_topology
from pvegpu.plan.vfio import VfioPlan, plan_vfio
from pvegpu.plan.vm import VmPlan, passable_problem, plan_vm


@dataclass(frozen=True)
class NodeObserved:
    """What a plan is computed from: the PCI hardware; on a Proxmox node the CPU vendor (None: not x86)
    and the running kernel's (major, minor), and the kernel command line tokens pvegpu's boot files say it
    owns (`owned_tokens`, of the bootloader in use)."""

    hardware: HostHardware
    cpu_kernel: CpuKernel | None = None
    owned_tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodePlan:
    """One host's plan (module docstring). On a host outside `pve_nodes`, `host`, `vfio` and `steps` are
    None and `functions` and `retired` are empty. `retired`: the command line tokens pvegpu owned and the
    profile no longer wants (a running kernel that has them still needs a reboot). `numa` is the VM's NUMA
    layout (None without `vm` data, or when it cannot be planned: `numa_problem` says why, and the VM role
    raises it). `vm`: a Proxmox node's VM (None elsewhere, or without `vm` data). `reboot_guard`: what a
    reboot of a Proxmox node must not cut (plan/reboot.py; None elsewhere). `owner`: the id pvegpu marks
    guests and mappings with (plan/ownership.py `owner_id`: `pve.owner`, else `pve.cluster`, else the node's
    name)."""

    name: str
    specs: HostSpecs
    owner: str
    groups: frozenset[str]
    hardware: HostHardware
    cpu_kernel: CpuKernel | None
    topology: Topology
    mapping_prefix: str
    mapping_ids: tuple[str, ...]
    functions: tuple[str, ...]
    host: HostProfile | None
    retired: tuple[str, ...]
    vfio: VfioPlan | None
    mmio: MmioWindow | None
    numa: NumaPlan | None
    numa_problem: str | None
    vm: VmPlan | None
    reboot_guard: RebootGuard | None
    steps: NodeSteps | None
    serving: ServingSteps | None
    problem: str | None

    @property
    def profile(self) -> str:
        return self.specs.node.profile

    @property
    def cpu_vendor(self) -> str | None:
        """A Proxmox node's CPU vendor (`amd`, `intel`); None elsewhere, or on a CPU without `vendor_id`."""
        return None if self.cpu_kernel is None else self.cpu_kernel.vendor

    @property
    def is_pve_node(self) -> bool:
        return PVE_NODES in self.groups

    def passable_problem(self) -> str | None:
        """Why the GPUs cannot be passed to a VM (every refused card and topology problem), or None."""
        return passable_problem(self.topology)


def plan_node(name: str, specs: HostSpecs, groups: frozenset[str], observed: NodeObserved) -> NodePlan:
    """The plan of host `name` (module docstring). Never raises for what the host is: a selector that
    matches nothing, a group that cannot be passed or an unknown CPU vendor becomes `problem`."""
    node, hardware = specs.node, observed.hardware
    topology = plan_topology(hardware, node.gpus)
    prefix = DEFAULT_PREFIX if specs.vm is None else specs.vm.mapping_prefix
    functions: tuple[str, ...] = ()
    host: HostProfile | None = None
    vfio: VfioPlan | None = None
    problem: str | None = None
    if PVE_NODES in groups:
        cpu_kernel = observed.cpu_kernel
        if cpu_kernel is None:
            raise ValueError(f"plan_node: Proxmox node {name} is planned without its CPU and kernel")
        try:
            host = host_profile(node.profile, cpu_kernel.vendor, specs.host.extra_cmdline)
            functions = profile_functions(node.profile, hardware, topology, node.gpus)
            if host.vfio:
                vfio = plan_vfio(hardware, functions, cpu_kernel.release)
        except PlanError as error:
            problem = str(error)
    numa, numa_problem = _numa(specs, hardware, topology)
    mmio = _mmio(specs, hardware, topology, observed.cpu_kernel)
    mapping_ids = tuple(mapping_id(prefix, index) for index in range(len(topology.gpus)))
    vm = None
    if PVE_NODES in groups and specs.vm is not None:
        vm = plan_vm(
            specs.vm,
            hardware,
            topology,
            mapping_ids=mapping_ids,
            window=mmio,
            numa=numa,
            numa_problem=numa_problem,
            cpu_vendor=None if observed.cpu_kernel is None else observed.cpu_kernel.vendor,
            root_user=specs.pve.root_user,
            model=specs.model,
            qemu_server=None if observed.cpu_kernel is None else observed.cpu_kernel.qemu_server,
        )
    waiting = held_by_vfio(node.profile, hardware, functions, specs.host.allow_reboot) if functions else None
    return NodePlan(
        name=name,
        specs=specs,
        owner=owner_id(specs.pve.owner, specs.pve.cluster, node.name),
        groups=groups,
        hardware=hardware,
        cpu_kernel=observed.cpu_kernel,
        topology=topology,
        mapping_prefix=prefix,
        mapping_ids=mapping_ids,
        functions=functions,
        host=host,
        retired=() if host is None else retired_tokens(observed.owned_tokens, host.tokens),
        vfio=vfio,
        mmio=mmio,
        numa=numa,
        numa_problem=numa_problem,
        vm=vm,
        reboot_guard=reboot_guard(specs) if PVE_NODES in groups else None,
        steps=node_steps(node.profile, has_container=specs.lxc is not None, waiting=waiting)
        if PVE_NODES in groups
        else None,
        serving=serving_steps(groups, waiting),
        problem=problem,
    )


def _numa(specs: HostSpecs, hardware: HostHardware, topology: Topology) -> tuple[NumaPlan | None, str | None]:
    """The VM's NUMA plan, or why there is none; (None, None) without `vm` data."""
    if specs.vm is None:
        return None, None
    try:
        return plan_numa(specs.vm, hardware, topology.gpus, specs.pve.root_user), None
    except PlanError as error:
        return None, str(error)


def _mmio(
    specs: HostSpecs, hardware: HostHardware, topology: Topology, cpu_kernel: CpuKernel | None
) -> MmioWindow | None:
    """The VM's 64-bit MMIO window, and what the guest gets with the node's CPU and qemu-server; None without
    `vm` data or a 64-bit prefetchable BAR (OVMF's default aperture is enough then)."""
    if specs.vm is None:
        return None
    known = cpu_kernel or CpuKernel(None, (0, 0))
    cards = passed_functions(hardware, topology.gpus)
    try:
        return plan_mmio(cards, specs.vm.memory, specs.vm.mmio, known.phys_bits, known.qemu_server)
    except ValueError:
        return None
