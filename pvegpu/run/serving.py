"""`serving_nccl(host)`: a serving host's NCCL plan as its SGLang service gets it, shared by the sglang role
(which writes it) and the doctor (which names it and checks NCCL's log against it).

The plan (pvegpu/plan/nccl.py) follows the host's profile; on a VM guest also its NCCL topology file (planned
from its node's plan and its own PCI tree, pvegpu/plan/nccl_topo.py) and whether P2P is proven: its node's
`vm.p2p` and the probe's record in the guest's state read (pvegpu/plan/p2p.py `guest_uses_p2p`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import logger
from pyinfra.api.host import Host

from pvegpu.inventory.guests import GUEST_OF_KEY
from pvegpu.plan.nccl import NcclPlan, has_infiniband, plan_nccl
from pvegpu.plan.nccl_topo import TOPO_FILE, NcclTopo, plan_nccl_topo
from pvegpu.plan.p2p import guest_uses_p2p
from pvegpu.run.host_state import node_p2p, state_of
from pvegpu.run.plan import node_host_of, plan_of


@dataclass(frozen=True)
class ServingNccl:
    """The host's NCCL plan, its VM guest's topology file (None elsewhere), and whether the plan uses P2P."""

    plan: NcclPlan
    topo: NcclTopo | None
    p2p: bool

    def describe(self, profile: str) -> str:
        """Which NCCL profile is in force and why, with its settings (README, "NCCL's settings per
        transport")."""
        if profile != "vm":
            why = f"P2P (profile {profile}: the host driver gives P2P)"
        elif self.p2p:
            why = "P2P (profile vm: P2P between the VM's GPUs is proven or forced, vm.p2p)"
        else:
            why = "SHM (profile vm: no P2P between passed-through GPUs)"
        settings = " ".join(f"{setting.name}={setting.value}" for setting in self.plan.env)
        return f"NCCL profile {why}: {settings}" + "".join(f" {flag.flag}" for flag in self.plan.flags)


def serving_nccl(target: Host) -> ServingNccl:
    """`target`'s NCCL plan (module docstring). PlanError when its data does not fit (the caller's
    `plan_failures` reports it)."""
    plan = plan_of(target)
    node, spec = plan.specs.node, plan.specs.sglang
    topo = _guest_nccl_topo(target) if node.profile == "vm" else None
    p2p = node.profile != "vm" or _guest_p2p(target)
    nccl = plan_nccl(
        node.profile,
        plan.topology,
        infiniband=has_infiniband(plan.hardware),
        overrides=spec.env,
        topo_file=TOPO_FILE if topo is not None else None,
        p2p=node.profile == "vm" and p2p,
    )
    return ServingNccl(nccl, topo, p2p)


def _guest_nccl_topo(target: Host) -> NcclTopo | None:
    """This VM guest's NCCL topology file, planned from its node's plan and its own PCI tree; None, with an
    info line, for a guest whose node is not in this run's inventory (`guest_of` unset: a guest listed by
    hand; or an inventory of guests only). PlanError when its GPUs do not map to the node's cards.

    The node is read through pyinfra's inventory (its plan, from the node's one state read over its own
    connection, pvegpu/run/node_state.py): one plan per host, and the file a compared write in the guest.
    """
    node_host = node_host_of(target)
    if node_host is None:
        logger.info(
            f"{target.print_prefix}no NCCL topology file: its node is not in this run's inventory "
            f"({GUEST_OF_KEY}: {target.data.get(GUEST_OF_KEY)}); NCCL sees the VM's flat PCI tree"
        )
        return None
    node_plan = plan_of(node_host)
    guest_hardware = plan_of(target).hardware
    return plan_nccl_topo(node_plan.topology, node_plan.hardware, guest_hardware, node_plan.cpu_vendor)


def _guest_p2p(target: Host) -> bool:
    """Whether this VM guest's NCCL plan uses P2P: its node's `vm.p2p` (the node in this run's inventory;
    else SHM) and the probe's record in the guest (in its state read)."""
    mode = node_p2p(target)
    if mode is None or mode == "off":
        return False
    uses = guest_uses_p2p(mode, state_of(target).p2p_record)
    logger.info(f"{target.print_prefix}vm.p2p {mode}: NCCL plan {'P2P' if uses else 'SHM'}")
    return uses
