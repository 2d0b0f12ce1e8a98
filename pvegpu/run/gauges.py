"""The content of pvegpu's textfiles for the node exporter (pvegpu/plan/gauges.py), from what the run already
reads: the host's plan and its one state read. Nothing is read here that the run does not read anyway.
The mappings' health and SGLang's readiness are not here: they are live, written by each host's gauges
timer (pvegpu/plan/gauges.py).

The values are observed, as the run leaves the host: the operation that writes a file comes last in the
host's run and computes its content when it executes, from the state read, which is read again after an
operation on the host changed something (pvegpu/run/host_state.py). So a converging run writes what it made,
and the next run, which changes nothing, finds the same values and writes nothing.

- node (`deploy/site.py`): where the node loads the driver (`lxc`, `baremetal`), whether the kernel it boots
  next has the NVIDIA module (plan/kernel_guard.py);
- serving host: with `sglang.model_repo`, the model complete as the fetcher verified it
  (plan/model_fetch.py `fetch_reason`); on a VM guest whose node is in the run, whether its NCCL plan uses
  P2P (plan/p2p.py `guest_uses_p2p`) and the probe's recorded verdict; on a VM guest with its driver
  installed, the next boot's kernel and module.
"""

from __future__ import annotations

from pyinfra.api.host import Host

from pvegpu.facts.model_store import parse_model_record
from pvegpu.models.boot import KernelBoot
from pvegpu.models.model_store import record_path
from pvegpu.plan import gauges
from pvegpu.plan.kernel_guard import kernel_problems, module_built_anywhere, next_boot_kernel
from pvegpu.plan.model_fetch import fetch_reason, serving_fetch_target
from pvegpu.plan.p2p import guest_uses_p2p
from pvegpu.run.host_state import node_p2p, state_of
from pvegpu.run.plan import plan_of


def node_gauges(target: Host) -> str:
    """The node's file (module docstring)."""
    plan = plan_of(target)
    steps = plan.steps
    boot = None
    if steps is not None and steps.host_driver:
        boot = next_boot_value(state_of(target).next_boot, plan.specs.driver.version, proxmox=True)
    return gauges.node_file(boot)


def serving_gauges(target: Host) -> str:
    """The serving host's file (module docstring)."""
    plan = plan_of(target)
    steps, spec = plan.serving, plan.specs.sglang
    state = state_of(target)
    model = p2p = boot = None
    fetch = serving_fetch_target(spec)
    if steps is not None and steps.sglang and fetch is not None:
        record = parse_model_record(state.records.get(record_path(fetch.path)))
        complete = fetch_reason(fetch, record, state.store) is None
        model = gauges.ModelValue(fetch.path, fetch.repo, fetch.revision or "main", complete)
    mode = node_p2p(target)
    if mode is not None:
        record_ = state.p2p_record
        verdict = None if record_ is None else (record_.mode, record_.verdict)
        p2p = gauges.P2pValue(mode, guest_uses_p2p(mode, record_), verdict)
    if steps is not None and steps.driver == "guest" and state.next_boot is not None:
        version = plan.specs.driver.version
        if module_built_anywhere(state.next_boot, version):  # else: the driver is not installed (yet)
            boot = next_boot_value(state.next_boot, version, proxmox=False)
    return gauges.serving_file(model=model, p2p=p2p, next_boot=boot)


def next_boot_value(boot: KernelBoot | None, driver: str, *, proxmox: bool) -> gauges.NextBootValue | None:
    """The next boot's gauge value from the state read's `boot` (None: not read)."""
    if boot is None:
        return None
    ready = not kernel_problems(boot, driver, proxmox=proxmox)
    return gauges.NextBootValue(next_boot_kernel(boot) or "none", driver, ready)
