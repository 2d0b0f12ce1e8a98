"""`state_of(host)`: the host's `HostState` (pvegpu/facts/guest_state.py), read once per host and run.

What is read comes from the host's plan (`state_request`): the paths, units, users, venv and key files of the
driver and SGLang roles the plan gives the host. The read is shared by preparing and running: the state is
read again only after an operation on this host changed something (ran a command), so a no-op run reads it
once, and an operation after a change decides from what that change left, as pyinfra's own facts did. What
another host's operation does to this one (the node restarting this VM) is not seen until this host changes
something itself.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pyinfra.api.host import Host
from pyinfra.api.state import State

from pvegpu.facts.guest_state import GuestState, HostState, StateRequest
from pvegpu.host_plan import plan_of
from pvegpu.models.specs import HostSpecs
from pvegpu.plan.driver import (
    CUDA_DISTROS,
    DEVICES_SERVICE,
    DEVICES_UNIT,
    KEYRING,
    MODULES_LOAD,
    NOUVEAU_DROP_IN,
    PERSISTENCED,
    PREFERENCES,
    Placement,
    cuda_list_path,
)
from pvegpu.plan.nccl_topo import TOPO_FILE
from pvegpu.plan.node import NodePlan
from pvegpu.plan.sglang_service import ENV_FILE, SECRETS_SCRIPT, SERVICE, UNIT_FILE, key_files

PVEGPU_ETC = "/etc/pvegpu"
PVEGPU_LIB = "/usr/local/lib/pvegpu"

_STATES: WeakKeyDictionary[State, dict[str, tuple[int, HostState]]] = WeakKeyDictionary()


def sglang_home(user: str) -> str:
    """The SGLang system user's home."""
    return f"/var/lib/{user}"


def state_request(plan: NodePlan) -> StateRequest:
    """Everything the driver (at each placement the plan gives) and SGLang roles decide from."""
    placements: list[Placement] = []
    if plan.steps is not None and plan.steps.host_driver:
        placements.append("pve-host")
    if plan.serving is not None and plan.serving.driver is not None:
        placements.append(plan.serving.driver)
    paths: list[str] = []
    units: list[str] = []
    if placements:
        paths += [KEYRING, *sorted({cuda_list_path(distro) for distro in CUDA_DISTROS.values()}), PREFERENCES]
    if any(placement != "container" for placement in placements):
        paths.append(NOUVEAU_DROP_IN)
        units.append(PERSISTENCED)
    if "pve-host" in placements:
        paths += [MODULES_LOAD, DEVICES_UNIT]
        units.append(DEVICES_SERVICE)
    serving_sglang = plan.serving is not None and plan.serving.sglang
    if not serving_sglang:
        return StateRequest(
            paths=tuple(paths), units=tuple(units), version_file=plan.specs.driver.version_file
        )
    return _with_sglang(plan.specs, paths, units)


def _with_sglang(specs: HostSpecs, paths: list[str], units: list[str]) -> StateRequest:
    spec = specs.sglang
    paths += [
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
    return StateRequest(
        paths=tuple(dict.fromkeys(paths)),
        units=(*units, SERVICE),
        users=(spec.user,),
        groups=(spec.user,),
        venvs=(spec.venv,),
        secrets=tuple(path for _, path, _ in key_files(spec)),
        version_file=specs.driver.version_file,
    )


def _changes(target: Host) -> int:
    """How many of this run's operations on `target` have run commands so far."""
    return sum(
        1
        for data in target.state.ops[target].values()
        if data.operation_meta.is_complete() and data.operation_meta.executed
    )


def state_of(target: Host) -> HostState:
    """The state of `target` (module docstring): read on first use, again only after a change."""
    states = _STATES.setdefault(target.state, {})
    changes = _changes(target)
    cached = states.get(target.name)
    if cached is not None and cached[0] == changes:
        return cached[1]
    state = target.get_fact(GuestState, request=state_request(plan_of(target)))
    states[target.name] = (changes, state)
    return state
