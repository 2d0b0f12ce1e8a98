"""A serving host's plan for its SGLang service: `plan_serving(...) -> ServingPlan`. Pure.

From the host's NCCL plan (`ServingNccl`: plan/nccl.py's settings for the profile, on a VM guest its topology
file, plan/nccl_topo.py, and whether P2P is in use), the checkpoint in `sglang.model_path`, the GPUs and
what the host's state read showed (key files, NCCL conf files): the recipe (plan/recipe.py), the full-name
argv checked against the pinned SGLang (plan/sglang.py), and what the service's templates are rendered from
(the env file's lines and profile note, ExecStart, the credentials: plan/sglang_service.py). A layout that
does not fit the GPUs, an argv the pinned SGLang would refuse, an extra argument the profile refuses, a key
file that breaks the rules, or an NCCL conf file that sets what the profile refuses is a PlanError, raised
while operations are collected: a running service keeps running. Computed once per host and run
(pvegpu/run/serving.py `serving_plan_of`); the sglang role reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.model_store import FetchTarget
from pvegpu.models.nccl import ConfSetting
from pvegpu.models.recipe import Checkpoint
from pvegpu.models.secret_file import SecretFile
from pvegpu.models.sglang import ProbeTarget, SglangSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.model_fetch import ModelFetch, fetch_plan
from pvegpu.plan.model_mount import SYSTEMD_UNITS, mount_unit_name
from pvegpu.plan.nccl import NcclPlan, Profile, conf_file_problems
from pvegpu.plan.nccl_topo import TOPO_FILE, NcclTopo
from pvegpu.plan.recipe import RecipePlan, plan_recipe
from pvegpu.plan.sglang import plan_sglang_argv, profile_problems
from pvegpu.plan.sglang_service import (
    ENV_FILE,
    SECRETS_SCRIPT,
    UNIT_FILE,
    credentials,
    exec_start,
    exec_start_pre,
    key_file_problems,
    probe_target,
)
from pvegpu.plan.sglang_started import record_start

_P2P_NOTE = (
    "the host driver gives P2P between the GPUs; NCCL_P2P_LEVEL lets NCCL use it across root complexes"
)
# The env file's first comment: why the NCCL settings below are what they are on this profile.
PROFILE_NOTES = {
    "vm": (
        "the GPUs are passed through to this VM, where P2P between them is not supported; "
        "NCCL uses shared memory and nothing here enables P2P"
    ),
    "lxc": _P2P_NOTE,
    "baremetal": _P2P_NOTE,
}


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


@dataclass(frozen=True)
class ServingPlan:
    """The SGLang service of one host (module docstring): its NCCL plan and topology file, the recipe (its
    `notes` are info lines for the run's output), the argv, and the values its templates take; `probe`: the
    readiness probe's target (plan/sglang_service.py `probe_target`); `model_fetch`: this host's own model
    fetch (None: nothing fetched here: no `sglang.model_repo`, or the node's store serves it);
    `model_directory`: whether pvegpu makes `model_path` (not where the node's store is mounted or is);
    `store_mount`: the mount unit of the node's store in a VM guest (plan/model_mount.py), else None;
    `started_files`: every file the service starts from, whose digests it records at start, with its
    `venv`'s SGLang version (`record_start`, plan/sglang_started.py); `restart`: why the running service
    must restart though this run writes none of them (set from the host's state read by
    pvegpu/run/serving.py), else None."""

    nccl: ServingNccl
    recipe: RecipePlan
    argv: tuple[str, ...]
    profile_note: str
    env_lines: tuple[str, ...]
    exec_start: str
    exec_start_pre: str | None
    credentials: tuple[tuple[str, str], ...]
    probe: ProbeTarget
    model_fetch: ModelFetch | None
    venv: str
    model_directory: bool = True
    store_mount: str | None = None
    started_files: tuple[str, ...] = ()
    restart: str | None = None

    @property
    def record_start(self) -> str:
        """The unit's first `ExecStartPre=`: the digests of `started_files` and of the venv's SGLang
        metadata at every start."""
        return record_start(self.started_files, self.venv)


def plan_serving(
    profile: Profile,
    spec: SglangSpec,
    nccl: ServingNccl,
    *,
    checkpoint: Checkpoint | None,
    gpu_ids: Sequence[str],
    secrets: Mapping[str, SecretFile],
    conf_files: Mapping[str, tuple[ConfSetting, ...] | None],
    fetch: FetchTarget | None = None,
) -> ServingPlan:
    """The plan of `spec` on a host of `profile` with GPUs of PCI ids `gpu_ids` (module docstring);
    `checkpoint`: the model's (None: none yet, or `recipe: none`), `secrets` and `conf_files` as the host's
    state read shows them; `fetch`: what this host fetches itself (pvegpu/run/serving.py `own_fetch`).
    PlanError with every problem, one line each."""
    recipe = plan_recipe(spec, checkpoint, gpu_ids, p2p=nccl.p2p)
    argv = plan_sglang_argv(spec, len(gpu_ids), (*nccl.plan.argv, *recipe.argv))
    problems = (
        *profile_problems(profile, spec),
        *key_file_problems(spec, dict(secrets), fetches=fetch is not None),
        *conf_file_problems(profile, nccl.plan, conf_files),
    )
    if problems:
        raise PlanError("\n".join(problems))
    shared = spec.model_share if fetch is None else None  # a fallback fetch makes its own directory
    store_mount = mount_unit_name(spec.model_path) if shared == "virtiofs" else None
    return ServingPlan(
        nccl=nccl,
        recipe=recipe,
        argv=argv,
        profile_note=PROFILE_NOTES[profile],
        env_lines=(*nccl.plan.env_file_lines(), *recipe.env_file_lines()),
        exec_start=exec_start(spec, argv),
        exec_start_pre=exec_start_pre(spec),
        credentials=credentials(spec),
        probe=probe_target(spec),
        model_fetch=None if fetch is None else fetch_plan(fetch),
        model_directory=shared is None,
        store_mount=store_mount,
        started_files=(
            UNIT_FILE,
            ENV_FILE,
            SECRETS_SCRIPT,
            *([] if nccl.topo is None else [TOPO_FILE]),
            *([] if store_mount is None else [f"{SYSTEMD_UNITS}/{store_mount}"]),
        ),
        venv=spec.venv,
    )
