"""The `lxc` profile's container on a Proxmox node: its plan (pvegpu/plan/lxc.py `plan_container`) from the
node's plan and what the node shows (its Proxmox VE release, the NVIDIA device nodes and character majors,
the loaded NVIDIA module) and the model store's path (`model`), read when the container role asks; and the
userspace driver in the container."""

from __future__ import annotations

from pyinfra.api.host import Host

from pvegpu.facts.boot import PveVersion
from pvegpu.facts.lxc_devices import ContainerDriverVersion, NvidiaDeviceNodes
from pvegpu.facts.nvidia import NvidiaModule
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import ContainerPlan, plan_container
from pvegpu.run.plan import plan_of


def container_plan_of(target: Host) -> ContainerPlan:
    """The container plan of node `target`. PlanError (the role's `plan_failures` reports it) without `lxc`
    data, on a host that is not Proxmox VE, or when `plan_container` refuses; each read only when the one
    before it found what the next needs."""
    plan = plan_of(target)
    spec = plan.specs.lxc
    if spec is None:
        raise PlanError("profile lxc needs `lxc` data (the container: vmid, ostemplate)")
    release = target.get_fact(PveVersion)
    if release is None:
        raise PlanError("profile lxc needs Proxmox VE (no pveversion on this host)")
    nodes = target.get_fact(NvidiaDeviceNodes)
    module = target.get_fact(NvidiaModule, version_file=plan.specs.driver.version_file)
    return plan_container(
        spec,
        len(plan.topology.gpus),
        release.major_minor,
        nodes.caps,
        nodes.majors,
        host_module=None if module is None else module.version,
        store=None if plan.specs.model is None else plan.specs.model.path,
    )


def container_userspace(target: Host, vmid: int) -> str | None:
    """The NVIDIA userspace driver version in container `vmid` on `target` (None: none, or not running)."""
    return target.get_fact(ContainerDriverVersion, vmid=vmid)
