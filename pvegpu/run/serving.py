"""A serving host's plans for its SGLang service, once per host and run, from its plan and state read.

`serving_nccl(host)`: the NCCL plan as its SGLang service gets it (pvegpu/plan/serving.py `ServingNccl`),
shared by the sglang role (which writes it) and the doctor (which names it and checks NCCL's log against
it). The plan (pvegpu/plan/nccl.py) follows the host's profile; on a VM guest also its NCCL topology file
(planned from its node's plan and its own PCI tree, pvegpu/plan/nccl_topo.py) and whether P2P is proven: its
node's `vm.p2p` and the probe's record in the guest's state read (pvegpu/plan/p2p.py `guest_uses_p2p`).

`serving_plan_of(host)`: the whole service's plan (pvegpu/plan/serving.py `ServingPlan`: NCCL, recipe, argv,
what the unit and env file are rendered from), which the sglang role reads. It is not part of `plan_of`:
the host's state read, which it needs (checkpoint, key files, NCCL conf files), is itself requested from
`plan_of` (pvegpu/run/host_state.py `state_request`).

`settings_in_force(host)`: the benchmark's label, the VM speed settings the serving host runs with now.
`bench_plan_of(host, output_file)`: the benchmark's cells and their argvs (pvegpu/plan/bench.py `BenchPlan`).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import State

from pvegpu.facts.nccl import topology_file_read
from pvegpu.facts.sglang import SglangNcclChannels, SglangNcclTopologyFile
from pvegpu.inventory.guests import GUEST_OF_KEY
from pvegpu.plan.bench import BenchPlan, SpeedSettings, plan_bench, speed_settings
from pvegpu.plan.nccl import has_infiniband, plan_nccl
from pvegpu.plan.nccl_topo import TOPO_FILE, NcclTopo, plan_nccl_topo
from pvegpu.plan.nccl_transports import uses_p2p
from pvegpu.plan.p2p import guest_uses_p2p
from pvegpu.plan.serving import ServingNccl, ServingPlan, plan_serving
from pvegpu.run.host_state import nccl_conf_files, node_p2p, serving_checkpoint, state_of
from pvegpu.run.plan import node_host_of, plan_of

_PLANS: WeakKeyDictionary[State, dict[str, ServingPlan]] = WeakKeyDictionary()


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


def serving_plan_of(target: Host) -> ServingPlan:
    """`target`'s SGLang service plan for this run (module docstring; planned on first use). PlanError when
    its data does not fit (the caller's `plan_failures` reports it)."""
    plans = _PLANS.setdefault(target.state, {})
    plan = plans.get(target.name)
    if plan is None:
        node_plan = plan_of(target)
        specs = node_plan.specs
        nccl = serving_nccl(target)
        state = state_of(target)
        plan = plans[target.name] = plan_serving(
            specs.node.profile,
            specs.sglang,
            nccl,
            checkpoint=serving_checkpoint(specs.sglang, state),
            gpu_ids=[gpu.id for gpu in node_plan.topology.gpus],
            secrets=state.secrets,
            conf_files=nccl_conf_files(state, specs),
        )
    return plan


def settings_in_force(target: Host) -> SpeedSettings:
    """The benchmark's label, from serving host `target` as it is now: its NUMA nodes (the hardware fact),
    what the running service's NCCL logged (its topology file, its transports) and the P2P probe's record
    (read with the host's state when its node's `vm.p2p` is not `off`)."""
    records = target.get_fact(SglangNcclChannels)
    said = target.get_fact(SglangNcclTopologyFile)
    return speed_settings(
        numa_nodes=len(plan_of(target).hardware.numa_nodes),
        nccl_logged=bool(records),
        topo_file_read=topology_file_read(said),
        p2p_in_use=uses_p2p(records),
        p2p_record=state_of(target).p2p_record,
    )


def bench_plan_of(target: Host, output_file: str) -> BenchPlan:
    """The benchmark run of serving host `target` from its `bench` and `sglang` data; `output_file`: the
    results file on the host (named by the run's id, the clock when the run starts)."""
    specs = plan_of(target).specs
    return plan_bench(specs.bench, specs.sglang, output_file)


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
