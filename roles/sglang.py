"""sglang: SGLang serving the model as a systemd service, with the NCCL settings of the node's profile.

System user, venv with the pinned SGLang, model directory (with `model_repo`: fetched and verified by
`pvegpu-model-fetch.service`, `pvegpu.operations.model_fetch`), `/etc/pvegpu/sglang.env`
(0600: the NCCL plan, each variable after its reason), on a VM guest `/etc/pvegpu/nccl-topo.xml` (its GPUs'
host NUMA nodes and PCIe links, `pvegpu.plan.nccl_topo`) and `sglang.service` from templates; the service
restarts only when its unit, environment, topology file or venv changed, or when it runs with other files
than those on disk (a run that stopped before restarting it: `pvegpu.plan.sglang_started`), then pvegpu waits
for /health and /v1/models. A layout that does not fit the GPUs found, an argv the pinned SGLang would
refuse, an extra argument the profile refuses, or a key file that is missing or breaks the rules of
`pvegpu.models.secret_file` fails while operations are collected, before any host is changed (a running
service keeps running). The keys reach SGLang through systemd credentials and a `--config` file
(`pvegpu.plan.sglang_service`). What is written comes from the host's serving plan (pvegpu/plan/serving.py,
`pvegpu.run.serving.serving_plan_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.context import host
from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed

from pvegpu.models.model import SHARE_ID
from pvegpu.models.model_store import (
    FETCH_CONFIG,
    FETCH_SCRIPT,
    FETCH_UNIT,
    FETCH_UNIT_FILE,
    ModelRecord,
    StoreFile,
)
from pvegpu.models.sglang import SglangSpec
from pvegpu.models.sglang_options import SGLANG_VERSION
from pvegpu.operations.from_state import directory, file_content, packages, service, system_group, system_user
from pvegpu.operations.model_fetch import fetch_unit, fetcher_source, model_fetch
from pvegpu.operations.nccl_topo import nccl_topo_file
from pvegpu.operations.render import render
from pvegpu.operations.sglang import sglang_ready, sglang_venv
from pvegpu.plan.model_fetch import ModelFetch
from pvegpu.plan.model_mount import SYSTEMD_UNITS
from pvegpu.plan.nccl import Profile
from pvegpu.plan.serving import ServingPlan
from pvegpu.plan.sglang import RUNTIME_DIRECTORY, SECRETS_CONFIG
from pvegpu.plan.sglang_service import ENV_FILE, SECRETS_SCRIPT, SERVICE, UNIT_FILE
from pvegpu.run.host_state import PVEGPU_ETC, PVEGPU_LIB, model_read, sglang_home
from pvegpu.run.plan import plan_failures, plan_of
from pvegpu.run.serving import serving_plan_of
from pvegpu.run.units import reload_if


@deploy("Serve the model with SGLang")
def sglang() -> None:
    """User, venv, model directory, env file, unit, start/restart when changed (in this run, or since the
    running service started: its start record), wait until it answers."""
    plan = plan_of(host)
    profile, spec = plan.specs.node.profile, plan.specs.sglang
    with plan_failures(host):
        # Before any operation: a bad key never stops (nor restarts) a running service.
        serving = serving_plan_of(host)
    for note in serving.recipe.notes:
        logger.info(f"{host.print_prefix}{note}")
    venv = _installed(spec, model_directory=serving.model_directory)
    mounted = [] if serving.store_mount is None else [_mounted_store(spec, serving.store_mount)]
    if serving.model_fetch is not None:
        _model(serving.model_fetch, *model_read(host, spec.model_path))
    unit, written = _service_files(profile, spec, serving)
    changes = [*written, venv, *mounted]
    if serving.restart is not None:
        logger.info(f"{host.print_prefix}{serving.restart}")
    # A restart the host's record asks for reloads the units too: the unit on disk may be one systemd has
    # not loaded yet (the run that wrote it stopped before its reload).
    systemd.daemon_reload(name="Reload systemd's units", _if=_or_pending(serving, unit))
    # Start-or-restart first, gated by the changes or the record; then the unconditional "running and
    # enabled", which then finds it running: one start on a first run, one restart after a change (in this
    # run, or written by a run that stopped before restarting it), none otherwise.
    service(
        name="Start or restart SGLang (its unit, environment or venv changed)",
        service=SERVICE,
        restarted=True,
        _if=_or_pending(serving, *changes),
    )
    started = service(name="Keep SGLang enabled and running", service=SERVICE, running=True, enabled=True)
    sglang_ready(
        name="Wait for SGLang to answer",
        target=serving.probe,
        key_files=tuple(path for _, path in serving.credentials),  # masked in the journal lines it shows
        timeout_s=spec.start_timeout_s,
        starting=serving.restart is not None or any(op.will_change for op in (started, *changes)),
    )


def _or_pending(serving: ServingPlan, *ops: OperationMeta) -> Callable[[], bool]:
    """`_if`: when one of `ops` changed the host, or the running service started from other files than
    those on disk (`serving.restart`)."""
    changed = any_changed(*ops)
    return lambda: serving.restart is not None or changed()


def _installed(spec: SglangSpec, *, model_directory: bool) -> OperationMeta:
    """The system user and group, the venv with the pinned SGLang (returned: its install restarts the
    service), the model directory (unless the node's store is mounted there) and pvegpu's directories."""
    system_group(name="Add the SGLang system group", group=spec.user)
    system_user(
        name="Add the SGLang system user",
        user=spec.user,
        group=spec.user,
        home=sglang_home(spec.user),
        shell="/usr/sbin/nologin",
    )
    packages(name="Install Python's venv support", packages=["python3-venv"])
    venv = sglang_venv(
        name=f"Install SGLang {SGLANG_VERSION} into {spec.venv}",
        venv=spec.venv,
        version=SGLANG_VERSION,
        pip_args=spec.pip_args,
    )
    if model_directory:
        directory(name="Create the model directory", path=spec.model_path, user=spec.user, group=spec.user)
    directory(name=f"Create {PVEGPU_ETC}", path=PVEGPU_ETC, mode="755")
    directory(name=f"Create {PVEGPU_LIB}", path=PVEGPU_LIB, mode="755")
    return venv


def _service_files(
    profile: Profile, spec: SglangSpec, serving: ServingPlan
) -> tuple[OperationMeta, list[OperationMeta]]:
    """The topology file (on a VM guest), the keys' script, the env file and the unit, from the serving
    plan; returned: the unit's write, and every write (a change restarts the service)."""
    topo = serving.nccl.topo
    topo_file = None
    if topo is not None:
        topo_file = nccl_topo_file(
            name="Write NCCL's topology file (the GPUs' host NUMA nodes and links)", content=topo.xml
        )
    script = file_content(
        name="Write the script that gives SGLang its keys from systemd credentials",
        content=render(
            "sglang/sglang-secrets.py.j2",
            user=spec.user,
            config=SECRETS_CONFIG,
            options=[name for name, _ in serving.credentials],
        ),
        path=SECRETS_SCRIPT,
        mode="644",
    )
    env = file_content(
        name="Write the service environment (NCCL settings with their reasons)",
        content=render(
            "sglang/sglang.env.j2",
            profile=profile,
            profile_note=serving.profile_note,
            lines=serving.env_lines,
        ),
        path=ENV_FILE,
        mode="600",
    )
    unit = _unit(spec, serving)
    return unit, [unit, env, script, *([topo_file] if topo_file is not None else [])]


def _unit(spec: SglangSpec, serving: ServingPlan) -> OperationMeta:
    """sglang.service, rendered from the serving plan."""
    return file_content(
        name="Write sglang.service",
        content=render(
            "sglang/sglang.service.j2",
            sglang_version=SGLANG_VERSION,
            served_model_name=spec.served_model_name,
            model_path=spec.model_path,
            user=spec.user,
            env_file=ENV_FILE,
            credentials=serving.credentials,
            runtime_directory=RUNTIME_DIRECTORY,
            exec_start_pre=serving.exec_start_pre,
            exec_start=serving.exec_start,
            store_mount=serving.store_mount,
            record_start=serving.record_start,
        ),
        path=UNIT_FILE,
        mode="644",
    )


def _mounted_store(spec: SglangSpec, name: str) -> OperationMeta:
    """The node's model store (the directory mapping `SHARE_ID`'s virtiofs) mounted read-only at
    `model_path` by the systemd mount unit `name`, at boot and now; returned: the unit's write (a new store
    under SGLang restarts it)."""
    unit = file_content(
        name=f"Write {name} (the node's model store, read-only)",
        content=render("model/model-store.mount.j2", tag=SHARE_ID, where=spec.model_path),
        path=f"{SYSTEMD_UNITS}/{name}",
    )
    systemd.daemon_reload(name=f"Reload systemd's units ({name})", _if=reload_if(host, name, unit))
    service(name="Mount the node's model store", service=name, running=True, enabled=True)
    return unit


def _model(fetch: ModelFetch, record: ModelRecord | None, files: Mapping[str, StoreFile] | None) -> None:
    """This host's own fetch (`model_repo` into `model_path`), verified by `pvegpu-model-fetch.service`."""
    file_content(name="Upload pvegpu's model fetcher", content=fetcher_source(), path=FETCH_SCRIPT)
    file_content(name="Write the model fetch's settings", content=fetch.config, path=FETCH_CONFIG)
    unit = file_content(name=f"Write {FETCH_UNIT}", content=fetch_unit(fetch, "sglang"), path=FETCH_UNIT_FILE)
    reload = reload_if(host, FETCH_UNIT, unit)
    systemd.daemon_reload(name=f"Reload systemd's units ({FETCH_UNIT})", _if=reload)
    model_fetch(name=f"Fetch and verify {fetch.target.repo}", target=fetch.target, record=record, files=files)
