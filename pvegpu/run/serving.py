"""A serving host's plans for its SGLang service, once per host and run, from its plan and state read.

`serving_nccl(host)`: the NCCL plan as its SGLang service gets it (pvegpu/plan/serving.py `ServingNccl`),
shared by the sglang role (which writes it) and the doctor (which names it and checks NCCL's log against
it). The plan (pvegpu/plan/nccl.py) follows the host's profile; on a VM guest also its NCCL topology file
(planned from its node's plan and its own PCI tree, pvegpu/plan/nccl_topo.py) and whether P2P is proven: its
node's `vm.p2p` and the probe's record in the guest's state read (pvegpu/plan/p2p.py `guest_uses_p2p`).

`serving_plan_of(host)`: the whole service's plan (pvegpu/plan/serving.py `ServingPlan`: NCCL, recipe, argv,
what the unit and env file are rendered from, and whether the running service started from other files than
those on disk: plan/sglang_started.py), which the sglang role reads. It is not part of `plan_of`:
the host's state read, which it needs (checkpoint, key files, NCCL conf files), is itself requested from
`plan_of` (pvegpu/run/host_state.py `state_request`).

`settings_in_force(host)`: the benchmark's label, the VM speed settings the serving host runs with now.
`bench_plan_of(host, output_file)`: the benchmark's cells and their argvs (pvegpu/plan/bench.py `BenchPlan`).
"""

from __future__ import annotations

from dataclasses import replace
from weakref import WeakKeyDictionary

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import State

from pvegpu.facts.checkpoint import WEIGHT_INDEX, checkpoint_records
from pvegpu.facts.host_read import HostRead, HostState, StateRequest
from pvegpu.facts.nccl import topology_file_read
from pvegpu.facts.sglang import SglangNcclChannels, SglangNcclTopologyFile
from pvegpu.inventory.guests import GUEST_OF_KEY
from pvegpu.models.model_store import FetchTarget
from pvegpu.models.recipe import Checkpoint
from pvegpu.models.sglang import SglangSpec
from pvegpu.models.specs import host_specs
from pvegpu.plan.bench import BenchPlan, SpeedSettings, plan_bench, speed_settings
from pvegpu.plan.errors import PlanError
from pvegpu.plan.model_fetch import fetch_reason, serving_fetch_target
from pvegpu.plan.model_mount import mount_unit_name
from pvegpu.plan.model_share import guest_fetch_line, virtiofs_available
from pvegpu.plan.nccl import has_infiniband, plan_nccl
from pvegpu.plan.nccl_topo import TOPO_FILE, NcclTopo, plan_nccl_topo
from pvegpu.plan.nccl_transports import uses_p2p
from pvegpu.plan.p2p import guest_uses_p2p
from pvegpu.plan.serving import ServingNccl, ServingPlan, plan_serving
from pvegpu.plan.sglang_service import SERVICE
from pvegpu.plan.sglang_started import STARTED_RECORD, restart_reason
from pvegpu.run.host_state import model_read, nccl_conf_files, node_p2p, serving_checkpoint, state_of
from pvegpu.run.node_state import node_state_of
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
        plan = plan_serving(
            specs.node.profile,
            specs.sglang,
            nccl,
            checkpoint=_checkpoint(target, state, fetch := own_fetch(target)),
            gpu_ids=[gpu.id for gpu in node_plan.topology.gpus],
            secrets=state.secrets,
            conf_files=nccl_conf_files(state, specs),
            fetch=fetch,
        )
        plan = replace(plan, restart=_restart(plan, state))
        _node_store_complete(target, fetch)
        plans[target.name] = plan
    return plan


def _restart(plan: ServingPlan, state: HostState) -> str | None:
    """Why the running service must restart though the files it starts from are on disk as planned: its
    start record (plan/sglang_started.py) shows others, or another SGLang than the venv holds; a file this
    run writes restarts it anyway."""
    unit = state.units.get(SERVICE)
    on_disk = {path: state.path(path).sha256 for path in plan.started_files}
    venv = state.venvs.get(plan.venv)
    return restart_reason(
        state.records.get(STARTED_RECORD),
        on_disk,
        running=unit is not None and unit.running,
        venv=plan.venv,
        venv_version=None if venv is None else venv.version,
    )


def _checkpoint(target: Host, state: HostState, fetch: FetchTarget | None) -> Checkpoint | None:
    """The checkpoint `target` serves, from its state read; for a VM guest whose mount of its node's store is
    not up yet (this run mounts it), as the node's store shows it (one read on the node, in that run alone),
    so that the recipe is the one later runs plan."""
    spec = plan_of(target).specs.sglang
    node_host = node_host_of(target)
    if fetch is not None or spec.model_share != "virtiofs" or node_host is None or _mounted(state, spec):
        return serving_checkpoint(spec, state)
    model = host_specs(node_host.data).model
    if model is None:
        return serving_checkpoint(spec, state)
    request = StateRequest(
        records=checkpoint_records(model.path), weight_index=f"{model.path}/{WEIGHT_INDEX}"
    )
    seen = serving_checkpoint(
        spec.model_copy(update={"model_path": model.path}), node_host.get_fact(HostRead, request=request)
    )
    return None if seen is None else replace(seen, path=spec.model_path)


def _mounted(state: HostState, spec: SglangSpec) -> bool:
    """Whether the VM guest's mount unit of its node's store runs (roles/sglang.py)."""
    mount = state.units.get(mount_unit_name(spec.model_path))
    return mount is not None and mount.running


def _node_store_complete(target: Host, fetch: FetchTarget | None) -> None:
    """PlanError when VM guest or container `target` sees its node's store (`sglang.model_share`) and its
    state read shows the store not complete: the node's run fetches it, and a later run here serves it. Not
    checked before the guest's mount of the store is up (this run mounts it: the node completed the store
    before it started the VM), nor on bare metal (its own run fetches first)."""
    spec = plan_of(target).specs.sglang
    wanted = serving_fetch_target(spec)
    if fetch is not None or wanted is None or spec.model_share not in ("virtiofs", "bind"):
        return
    if spec.model_share == "virtiofs" and not _mounted(state_of(target), spec):
        return
    reason = fetch_reason(wanted, *model_read(target, spec.model_path))
    if reason is not None:
        raise PlanError(
            f"model: {spec.model_path}: the node's store is not complete ({reason}); the node's "
            "deploy/site.py fetches it: run it again once it has"
        )


def own_fetch(target: Host) -> FetchTarget | None:
    """What serving host `target` fetches itself: `sglang.model_repo` into `model_path` when it does not see
    its node's store (`sglang.model_share` unset), or as the fallback of a VM guest whose node's qemu-server
    has no virtiofs (the node in this run's inventory; one info line says so); else None."""
    spec = plan_of(target).specs.sglang
    fetch = serving_fetch_target(spec)
    if fetch is None or spec.model_share is None:
        return fetch
    node_host = node_host_of(target) if spec.model_share == "virtiofs" else None
    if node_host is None:
        return None
    qemu_server = node_state_of(node_host).cpu_kernel.qemu_server
    if qemu_server is None or virtiofs_available(qemu_server):
        return None
    logger.info(f"{target.print_prefix}{guest_fetch_line(qemu_server, spec.model_path)}")
    return fetch


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
