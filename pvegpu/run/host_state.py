"""`state_of(host)`: the host's `HostState` (pvegpu/facts/host_read.py), read once per host and run.

What is read comes from the host's plan (`state_request`): the paths, units, users, venv and key files of the
driver and SGLang roles the plan gives the host, the initramfs images older than the driver's nouveau
blacklist, on a VM guest whose node's `vm.p2p` is not `off` the P2P probe's record (`node_p2p`), on a
serving host the node exporter's unit and pvegpu's textfile (pvegpu/run/exporter.py), and where the driver's
module is built the kernel booted next (pvegpu/run/gauges.py). The read
is shared by preparing and running: the state is read again only after an operation on this host changed
something (ran a command), so a no-op run reads it once, and an operation after a change decides from what
that change left, as pyinfra's own facts did. What another host's operation does to this one (the node
restarting this VM) is not seen until this host changes something itself. A serving host outside pve_nodes
that `read_serving_host` before its plan gets its PCI hardware in the same command as its state.
"""

from __future__ import annotations

from dataclasses import replace
from weakref import WeakKeyDictionary

from pyinfra.api.host import Host
from pyinfra.api.state import State

from pvegpu.facts.checkpoint import WEIGHT_INDEX, checkpoint_records, read_checkpoint
from pvegpu.facts.host_read import HostRead, HostState, StateRequest
from pvegpu.facts.model_store import StoreRead, parse_model_record
from pvegpu.facts.nccl_conf import parse_nccl_conf
from pvegpu.facts.parsing import ParseError
from pvegpu.facts.serving_read import ServingRead
from pvegpu.models.exporter import EXPORTER_SERVICE, GAUGES_SERVICE, GAUGES_TIMER, SERVING_FILE, TIMER_FILES
from pvegpu.models.groups import PVE_NODES
from pvegpu.models.model_store import FETCH_CONFIG, FETCH_SCRIPT, FETCH_UNIT, FETCH_UNIT_FILE, record_path
from pvegpu.models.nccl import SYSTEM_CONF, USER_CONF_NAME, ConfSetting
from pvegpu.models.p2p import RECORD_PATH, P2pMode
from pvegpu.models.recipe import Checkpoint
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.specs import HostSpecs, host_specs
from pvegpu.plan.driver import (
    CUDA_DISTROS,
    DEVICES_SERVICE,
    DEVICES_UNIT,
    KEYRING,
    MODULES_LOAD,
    NOUVEAU_DROP_IN,
    PERSISTENCED,
    PREFERENCES,
    UVM_OPTIONS,
    Placement,
    cuda_list_path,
    disables_hmm,
)
from pvegpu.plan.errors import PlanError
from pvegpu.plan.model_mount import SYSTEMD_UNITS, mount_unit_name
from pvegpu.plan.nccl_topo import TOPO_FILE
from pvegpu.plan.node import NodePlan
from pvegpu.plan.profile import NodeSteps, ServingSteps, serving_steps
from pvegpu.plan.sglang_service import ENV_FILE, SECRETS_SCRIPT, SERVICE, UNIT_FILE, key_files, probe_target
from pvegpu.plan.sglang_started import STARTED_RECORD
from pvegpu.run.early_read import recording
from pvegpu.run.plan import node_host_of, plan_of, planned, provide_hardware
from pvegpu.run.progress import commands_run

PVEGPU_ETC = "/etc/pvegpu"
MODULE_PLACEMENTS: tuple[Placement, ...] = ("guest", "pve-host")  # the driver's kernel module is built there
PVEGPU_LIB = "/usr/local/lib/pvegpu"

_STATES: WeakKeyDictionary[State, dict[str, tuple[int, HostState]]] = WeakKeyDictionary()


def sglang_home(user: str) -> str:
    """The SGLang system user's home."""
    return f"/var/lib/{user}"


def nccl_conf_paths(specs: HostSpecs) -> tuple[str, ...]:
    """The NCCL conf files the state read takes: in a VM (where they could set what the profile refuses,
    pvegpu.plan.nccl.conf_file_problems) the SGLang user's `~/.nccl.conf` and `/etc/nccl.conf`; else none."""
    if specs.node.profile != "vm":
        return ()
    return (f"{sglang_home(specs.sglang.user)}/{USER_CONF_NAME}", SYSTEM_CONF)


def nccl_conf_files(state: HostState, specs: HostSpecs) -> dict[str, tuple[ConfSetting, ...] | None]:
    """Each of `nccl_conf_paths(specs)` as NCCL reads it (None: absent), from the read that requested them."""
    return {
        path: None if (text := state.records[path]) is None else parse_nccl_conf(text)
        for path in nccl_conf_paths(specs)
    }


def node_p2p(target: Host) -> P2pMode | None:
    """The `vm.p2p` of the node whose VM guest `target` is; None when `target` is no guest, or its node is not
    in this run's inventory or has no `vm`."""
    node_host = node_host_of(target)
    # From the node's specs, not its plan: a guest's read need not wait for its node's.
    vm = None if node_host is None else host_specs(node_host.data).vm
    return None if vm is None else vm.p2p


def state_request(plan: NodePlan, p2p: P2pMode | None = None) -> StateRequest:
    """Everything the driver (at each placement the plan gives) and SGLang roles decide from: where the driver
    blacklists nouveau, the initramfs images older than that blacklist; the P2P probe's record when `p2p`
    (the guest's node's `vm.p2p`, `node_p2p`) is `probe` or `on`; SGLang's readiness probe."""
    return _request(plan.specs, plan.steps, plan.serving, p2p)


def _request(
    specs: HostSpecs, steps: NodeSteps | None, serving: ServingSteps | None, p2p: P2pMode | None
) -> StateRequest:
    records = (RECORD_PATH,) if p2p in ("probe", "on") else ()
    placements: list[Placement] = []
    if steps is not None and steps.host_driver:
        placements.append("pve-host")
    if serving is not None and serving.driver is not None:
        placements.append(serving.driver)
    paths: list[str] = []
    units: list[str] = []
    initramfs_after = None
    if placements:
        paths += [KEYRING, *sorted({cuda_list_path(distro) for distro in CUDA_DISTROS.values()}), PREFERENCES]
    if any(placement != "container" for placement in placements):
        paths.append(NOUVEAU_DROP_IN)
        units.append(PERSISTENCED)
        initramfs_after = NOUVEAU_DROP_IN
    if any(disables_hmm(placement, specs.node.profile) for placement in placements):
        paths.append(UVM_OPTIONS)
    if "pve-host" in placements:
        paths += [MODULES_LOAD, DEVICES_UNIT]
        units.append(DEVICES_SERVICE)
    if serving is not None:  # the node exporter, the serving host's gauges and timer (pvegpu/run/exporter.py)
        paths += [SERVING_FILE, *TIMER_FILES]
        units += [EXPORTER_SERVICE, GAUGES_TIMER, GAUGES_SERVICE]
    request = StateRequest(
        paths=tuple(paths),
        units=tuple(units),
        records=records,
        initramfs_after=initramfs_after,
        version_file=specs.driver.version_file,
        # The kernel booted next and its NVIDIA module, for the gauges (pvegpu/run/gauges.py).
        next_boot=any(placement in MODULE_PLACEMENTS for placement in placements),
    )
    serving_sglang = serving is not None and serving.sglang
    return _with_sglang(specs, request) if serving_sglang else request


def _with_sglang(specs: HostSpecs, request: StateRequest) -> StateRequest:
    spec = specs.sglang
    paths = [
        *request.paths,
        sglang_home(spec.user),
        spec.model_path,
        f"{spec.model_path}/config.json",
        PVEGPU_ETC,
        PVEGPU_LIB,
        TOPO_FILE,
        SECRETS_SCRIPT,
        ENV_FILE,
        UNIT_FILE,
    ]
    checkpoint = spec.recipe != "none"
    fetched = spec.model_repo is not None
    if fetched:
        paths += [FETCH_SCRIPT, FETCH_CONFIG, FETCH_UNIT_FILE]
    # A VM guest's mount of its node's store (roles/sglang.py), whether or not its node gives virtiofs.
    mount = [mount_unit_name(spec.model_path)] if spec.model_share == "virtiofs" else []
    paths += [f"{SYSTEMD_UNITS}/{unit}" for unit in mount]
    return replace(
        request,
        records=(
            *request.records,
            *nccl_conf_paths(specs),
            *(checkpoint_records(spec.model_path) if checkpoint else ()),
            *([record_path(spec.model_path)] if fetched else []),
            STARTED_RECORD,
        ),
        weight_index=f"{spec.model_path}/{WEIGHT_INDEX}" if checkpoint else None,
        model_store=spec.model_path if fetched else None,
        paths=tuple(dict.fromkeys(paths)),
        units=(*request.units, *mount, *([FETCH_UNIT] if fetched else []), SERVICE),
        users=(spec.user,),
        groups=(spec.user,),
        venvs=(spec.venv,),
        secrets=tuple(path for _, path, _ in key_files(spec)),
        probe=probe_target(spec),
    )


def serving_checkpoint(spec: SglangSpec, state: HostState) -> Checkpoint | None:
    """The checkpoint in `spec.model_path` as `state` (read with `_with_sglang`'s request) shows it; None
    without a config.json or with `recipe: none`. PlanError naming the file when one is not JSON."""
    if spec.recipe == "none":
        return None
    try:
        return read_checkpoint(spec.model_path, state.records, state.layers)
    except ParseError as error:
        raise PlanError(f"{SGLANG_KEY}.model_path: {error}") from None


def model_read(target: Host, path: str) -> StoreRead:
    """The fetcher's record and the files of the model directory `path` on serving host `target`, from its
    state read (`_with_sglang` reads them with `sglang.model_repo`)."""
    state = state_of(target)
    return parse_model_record(state.records.get(record_path(path))), state.store


def read_serving_host(target: Host) -> None:
    """Before a serving host's plan: its PCI hardware and its state in ONE command (`ServingRead`), shared by
    its plan (`provide_hardware`) and its operations (`state_of`), as `plan_of` and `state_of` would read
    them one after the other. Nothing for a Proxmox node (it has its own read, pvegpu/run/node_state.py) or a
    host already planned or read in this run."""
    states = _STATES.setdefault(target.state, {})
    groups = frozenset(target.groups)
    if PVE_NODES in groups or planned(target) or target.name in states:
        return
    specs = host_specs(target.data)
    # What plan_node gives a host outside pve_nodes: no node steps, nothing held by vfio-pci.
    request = _request(specs, None, serving_steps(groups, waiting=None), node_p2p(target))
    with recording(target):
        read = target.get_fact(ServingRead, sysfs_root=specs.node.sysfs_root, request=request)
    provide_hardware(target, read.hardware)
    states[target.name] = (commands_run(target), read.state)


def state_of(target: Host) -> HostState:
    """The state of `target` (module docstring): read on first use, again only after a change."""
    states = _STATES.setdefault(target.state, {})
    changes = commands_run(target)
    cached = states.get(target.name)
    if cached is not None and cached[0] == changes:
        return cached[1]
    request = state_request(plan_of(target), node_p2p(target))
    with recording(target):
        state = target.get_fact(HostRead, request=request)
    states[target.name] = (changes, state)
    return state


def unchanged_state(target: Host) -> HostState | None:
    """The state read of `target` while no operation on it has run a command since it was taken; None when
    something changed since, or it was not read in this run (nothing is read here)."""
    cached = _STATES.get(target.state, {}).get(target.name)
    return cached[1] if cached is not None and cached[0] == commands_run(target) else None
