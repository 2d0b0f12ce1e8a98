"""`plan_of(host)`: the host's NodePlan (pvegpu/plan/node.py), computed once per host and run.

The plan's inputs are read here, once: the validated specs (`host.data`), the host's inventory groups and the
PCI hardware; on a Proxmox node the hardware, CPU vendor and kernel release come from the node's one state
read (pvegpu/run/node_state.py), which its operations then share; on a serving host, from the read of its
hardware and state together when its roles asked for that first (`provide_hardware`). pyinfra calls the roles
while it prepares a run; every role of the run then reads the same plan.

The hosts relate to each other here alone: a VM guest's node (`node_host_of`), a node's VM guest and that
guest's SGLang venv (`guest_host_of`, `guest_venv`), a node's cluster peers and which of them syncs the
cluster's PCI mappings (`cluster_hosts`, `syncs_mappings`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from weakref import WeakKeyDictionary

from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.state import State

from pvegpu.facts.hardware import PciHardware
from pvegpu.inventory.guests import GUEST_OF_KEY
from pvegpu.models.boot import BootLoaderKind
from pvegpu.models.groups import PVE_NODES
from pvegpu.models.hardware import HostHardware
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.spec_validation import spec_of
from pvegpu.models.specs import host_specs
from pvegpu.plan.errors import PlanError
from pvegpu.plan.node import NodeObserved, NodePlan, plan_node
from pvegpu.plan.vm import unbound_functions
from pvegpu.pve.host_client import api_spec
from pvegpu.run.node_state import node_state_of

_PLANS: WeakKeyDictionary[State, dict[str, NodePlan]] = WeakKeyDictionary()
# Per run: the PCI hardware of hosts outside pve_nodes read along with their state (`provide_hardware`).
_HARDWARE: WeakKeyDictionary[State, dict[str, HostHardware]] = WeakKeyDictionary()


def plan_of(target: Host) -> NodePlan:
    """The plan of pyinfra host `target` for this run (read and computed on first use)."""
    plans = _PLANS.setdefault(target.state, {})
    plan = plans.get(target.name)
    if plan is None:
        specs = host_specs(target.data)
        groups = frozenset(target.groups)
        if PVE_NODES in groups:
            node = node_state_of(target)
            files = node.boot_files
            owned = files.grub_tokens if node.boot.kind is BootLoaderKind.GRUB else files.owned_tokens
            observed = NodeObserved(hardware=node.hardware, cpu_kernel=node.cpu_kernel, owned_tokens=owned)
        else:
            hardware = _HARDWARE.get(target.state, {}).get(target.name)
            if hardware is None:
                hardware = target.get_fact(PciHardware, sysfs_root=specs.node.sysfs_root)
            observed = NodeObserved(hardware=hardware)
        plan = plans[target.name] = plan_node(target.name, specs, groups, observed)
    return plan


def planned(target: Host) -> bool:
    """Whether `target`'s plan was computed in this run (its hardware read)."""
    return target.name in _PLANS.get(target.state, {})


def provide_hardware(target: Host, hardware: HostHardware) -> None:
    """The PCI hardware of `target` (outside pve_nodes, not planned yet), read in one command with its state
    (pvegpu.run.host_state.read_serving_host): its plan is computed from it instead of reading it again."""
    _HARDWARE.setdefault(target.state, {})[target.name] = hardware


def unbound_now(target: Host) -> tuple[str, ...]:
    """The functions of node `target`'s GPUs not bound to vfio-pci now, from its PCI hardware read again (the
    plan's read is from before this run's changes: deploy/site.py may reboot the host into vfio binding)."""
    plan = plan_of(target)
    hardware = target.get_fact(PciHardware, sysfs_root=plan.specs.node.sysfs_root)
    return unbound_functions(hardware, plan.topology)


def node_host_of(guest: Host) -> Host | None:
    """The Proxmox node of VM guest `guest` in this run's inventory (its `guest_of`); None for a host that is
    no guest, or whose node is not in the inventory (a guest listed by hand, an inventory of guests only)."""
    name = guest.data.get(GUEST_OF_KEY)
    return guest.state.inventory.get_host(str(name), None) if name else None


def guest_host_of(node_host: Host) -> Host | None:
    """The VM guest of Proxmox node `node_host` in this run's inventory (the host whose `guest_of` names it);
    None when the inventory lists none."""
    return next(
        (other for other in node_host.state.inventory if other.data.get(GUEST_OF_KEY) == node_host.name), None
    )


def guest_venv(node_host: Host) -> str:
    """The SGLang venv of `node_host`'s VM guest: its `sglang.venv` when the guest is in this run's inventory,
    else the default."""
    guest = guest_host_of(node_host)
    return SglangSpec().venv if guest is None else spec_of(guest.data, SGLANG_KEY, SglangSpec).venv


def cluster_hosts(target: Host) -> list[Host]:
    """The inventory hosts in `target`'s cluster, sorted by name (`target` alone when it has none)."""
    # From the data alone: a plan reads its host's hardware, which this does not need.
    cluster = api_spec(target.data).cluster
    if cluster is None:
        return [target]
    peers = [
        other
        for other in target.state.inventory
        if PVE_NODES in other.groups and api_spec(other.data).cluster == cluster
    ]
    return sorted(peers, key=lambda other: other.name)


def syncs_mappings(target: Host) -> bool:
    """Whether `target` is the node that syncs its cluster's mappings: the first by inventory name."""
    return cluster_hosts(target)[0] is target


@contextmanager
def plan_failures(host: Host, what: str = "") -> Iterator[None]:
    """A planner's `PlanError` under it stops the host's run as pyinfra's OperationError, one
    `<host>: <what><message>` text (the message names the field or device), while pyinfra prepares the run:
    before any operation of the role, so a bad input never stops nor changes a running host."""
    try:
        yield
    except PlanError as error:
        raise OperationError(f"{host.name}: {what}{error}") from None
