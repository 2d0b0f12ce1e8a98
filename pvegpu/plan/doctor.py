"""The node doctor's findings (roles/doctor.py): from the host's plan and what pvegpu/run/doctor_reads.py
read through the Proxmox API and of the node's files, the lines to log, each with its level. Pure.

- `token_check` / `privileges_findings`: with the `https` backend, who writes the root-only keys and whether
  the API token holds every privilege pvegpu needs on this node's paths (plan/privileges.py).
- `mapping_health`: whether the VM's mappings (`<prefix><N>`) are valid on this node, renumber-only drift,
  or hardware changed, one line per GPU: the decision the pre-start hook's repair would make (`plan_heal`,
  with the inventory's owner: a mapping without pvegpu's mark is not repaired), never made.
- `hook_status`: whether the VM's pre-start hookscript (vm.self_heal) is installed and
  current: the VM's `hookscript` names it, and the wrapper and zipapp on the node are the bytes this pvegpu
  would write.
- `numa_layout`, `mmio_window`: the VM's NUMA layout and 64-bit MMIO window pvegpu plans, or why not.

A read that failed is `NotRead` (its one line): the finding says `not read: <line>` as a warning. The
findings, reads and hook files are plain values (pvegpu/models/doctor.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.doctor import Finding, HookRead, NotRead
from pvegpu.models.pve import PciMapping
from pvegpu.models.vm import VmSpec
from pvegpu.plan.heal import Health, plan_heal
from pvegpu.plan.node import NodePlan
from pvegpu.plan.ownership import owner_id
from pvegpu.plan.privileges import (
    PrivilegeAt,
    acl_paths,
    missing_privileges,
    node_ids,
    privileges_report,
    required_privileges,
)
from pvegpu.plan.vm import hookscript_volid, is_pvegpu_hookscript

REBUILD = "pyinfra inventory.py deploy/rebuild_vm.py"
_HEALTH_ADVICE = {
    Health.VALID: "",
    Health.DRIFT: f" (only bus and group numbers changed: `{REBUILD}` repairs them)",
    Health.CHANGED: f" (check the hardware, then run `{REBUILD}`)",
}
_VM_STEP = "`pyinfra inventory.py deploy/vm.py`"


@dataclass(frozen=True)
class TokenCheck:
    """The API token's check on this node: its id, who writes the keys only root@pam may set, the
    privileges pvegpu needs (`required`) and the ACL paths to read them on (`paths`)."""

    token_id: str
    root_writer: str
    required: tuple[PrivilegeAt, ...]
    paths: tuple[str, ...]


def token_check(plan: NodePlan) -> TokenCheck | None:
    """The token's check (plan/privileges.py); None unless the `https` backend with an API token."""
    pve = plan.specs.pve
    if pve.backend != "https" or pve.token_id is None:
        return None
    root = "root's pvesh over SSH (pve.root_ssh)" if pve.root_user else "nobody (pve.root_ssh: false)"
    required = required_privileges(node_ids(plan.specs, plan.mapping_ids))
    return TokenCheck(pve.token_id, root, required, acl_paths(required))


def privileges_findings(
    check: TokenCheck, granted: Mapping[str, frozenset[str]] | NotRead
) -> tuple[Finding, ...]:
    """Who writes the root-only keys, then all privileges held, each missing one with its path and why, or
    why they were not read (`granted`: ACL path -> the privileges the token holds there)."""
    writer = Finding(f"keys only root@pam may set are written by {check.root_writer}")
    if isinstance(granted, NotRead):
        return writer, Finding(f"API token {check.token_id}: privileges not read: {granted.line}", True)
    missing = missing_privileges(check.required, granted)
    return writer, Finding(privileges_report(check.token_id, check.required, missing), bool(missing))


def mapping_health(plan: NodePlan, sections: Sequence[PciMapping] | NotRead) -> tuple[Finding, ...]:
    """The health of the VM's mappings on this node (module docstring) from the cluster's `sections`."""
    vm, node = _vm(plan), plan.specs.node.name
    subject = f"PCI mappings of VM {vm.vmid} ({vm.name}) on node {node}"
    if isinstance(sections, NotRead):
        return (Finding(f"{subject}: not read: {sections.line}", True),)
    pve = plan.specs.pve
    owner = owner_id(pve.owner, pve.cluster, node)  # the hook repairs only mappings with this mark
    healed = plan_heal(node, sections, plan.hardware, plan.mapping_prefix, owner)
    if not healed.gpus:
        return (Finding(f"{subject}: none ({plan.mapping_prefix}<N>) yet; {_VM_STEP} creates them", True),)
    lines = "".join(f"\n  {line}" for line in healed.findings)
    advice = _HEALTH_ADVICE[healed.health]
    return (Finding(f"{subject}: {healed.health.value}{advice}{lines}", healed.health is not Health.VALID),)


def hook_status(vm: VmSpec, read: HookRead | NotRead) -> tuple[Finding, ...]:
    """The hook's status (module docstring): off, installed and current, or each problem and the fix."""
    subject = f"pre-start hook of VM {vm.vmid} (vm.self_heal {vm.self_heal})"
    if isinstance(read, NotRead):
        return (Finding(f"{subject}: not read: {read.line}", True),)
    problems = hook_problems(vm, read)
    if not problems:
        state = "off" if vm.self_heal == "off" else "installed and current"
        return (Finding(f"{subject}: {state}"),)
    return (Finding(f"{subject}: {'; '.join(problems)} ({_VM_STEP} fixes it)", True),)


def hook_problems(vm: VmSpec, read: HookRead) -> list[str]:
    """What differs from the hook pvegpu installs (with `off`: only pvegpu's hookscript still named)."""
    current = read.hookscript
    if vm.self_heal == "off":
        return [f"the VM still runs pvegpu's hookscript {current}"] if is_pvegpu_hookscript(current) else []
    problems = [] if current == hookscript_volid(vm) else [f"the VM's hookscript is {current or 'not set'}"]
    for file in read.files:
        if file.found is None:
            problems.append(f"{file.path} is missing")
        elif file.found != file.wanted:
            problems.append(f"{file.path} is not pvegpu {read.version}'s")
    return problems


def numa_layout(plan: NodePlan) -> tuple[Finding, ...]:
    """The VM's NUMA layout pvegpu plans (plan/numa.py), why, and its keys; or why it has none."""
    if plan.numa is None:
        return (Finding(f"VM NUMA layout: {plan.numa_problem}", True),)
    keys = ", ".join(f"{key}: {value}" for key, value in plan.numa.keys().items())
    return (Finding(f"VM NUMA layout {plan.numa.layout} ({plan.numa.reason}): {keys}"),)


def mmio_window(plan: NodePlan) -> tuple[Finding, ...]:
    """The 64-bit MMIO window the VM's guest gets (plan/mmio.py), or why it cannot hold the BARs."""
    window, vm = plan.mmio, plan.specs.vm
    if window is None or vm is None:
        return ()
    if window.problem is not None:
        return (Finding(f"VM {vm.vmid}: vm.mmio: {window.problem}", True),)
    return (Finding(f"VM {vm.vmid}: {window.guest}"),)


def _vm(plan: NodePlan) -> VmSpec:
    vm = plan.specs.vm
    assert vm is not None  # the doctor asks only with `vm` data
    return vm
