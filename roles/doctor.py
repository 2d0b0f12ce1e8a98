"""Doctor: a read-only report of each node. It reads (the host's plan, pvegpu/run/reports.py, the Proxmox API)
and prints; it never changes a host."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.cli.report import render_table
from pvegpu.hook.bundle import BUNDLE_PATH, build, wrapper
from pvegpu.models.node import NodeSpec
from pvegpu.plan.cmdline import HOST_P2P_PROFILES
from pvegpu.plan.heal import Health, plan_heal
from pvegpu.plan.host_checks import checks_to_json, host_checks, render_checks
from pvegpu.plan.kernel_guard import next_boot_report
from pvegpu.plan.node import NodePlan
from pvegpu.plan.ownership import owner_id
from pvegpu.plan.privileges import (
    acl_paths,
    missing_privileges,
    node_ids,
    privileges_report,
    required_privileges,
)
from pvegpu.plan.topology import Topology
from pvegpu.plan.vm import HOOKSCRIPT, hookscript_volid, is_pvegpu_hookscript
from pvegpu.pve.errors import PveError
from pvegpu.pve.host_client import PveSetupError, pve_client
from pvegpu.run.plan import plan_of
from pvegpu.run.reports import file_sha256, host_check_data, next_boot

# Where the JSON reports go on the operator's machine (one file per host); relative to the working directory.
REPORT_DIR_ENV = "PVEGPU_DOCTOR_DIR"
REPORT_DIR = "pvegpu-doctor"
REBUILD = "pyinfra inventory.py deploy/rebuild_vm.py"
_HEALTH_ADVICE = {
    Health.VALID: "",
    Health.DRIFT: f" (only bus and group numbers changed: `{REBUILD}` repairs them)",
    Health.CHANGED: f" (check the hardware, then run `{REBUILD}`)",
}


@deploy("Report the node")
def node_report() -> None:
    """The GPU topology and the host checks, from two remote commands (`PciHardware`, `HostChecks`); on a
    Proxmox node the API token's privileges (`https`), and with `vm` data the health of its VM's PCI
    mappings, read through the API.

    The hardware and topology come from the host's plan (read once per run).
    """
    plan = plan_of(host)
    _gpu_topology(plan.specs.node, plan.topology)
    _host_checks(plan)
    if plan.specs.node.profile in HOST_P2P_PROFILES:
        _next_boot(plan)
    if plan.is_pve_node:
        _token_privileges(plan)
    if plan.is_pve_node and plan.specs.vm is not None:
        _mapping_health(plan)
        _hook_status(plan)
        _numa_layout(plan)
        _mmio_window(plan)


def _next_boot(plan: NodePlan) -> None:
    """On a host serving from its own NVIDIA driver: whether the kernel it boots next has the module the
    pinned driver needs (plan/kernel_guard.py), or what is missing and the fix."""
    ok, lines = next_boot_report(next_boot(host), plan.specs.driver.version, proxmox=plan.is_pve_node)
    log = logger.info if ok else logger.warning
    for line in lines:
        log(f"{host.print_prefix}next boot: {line}")


def _token_privileges(plan: NodePlan) -> None:
    """With the `https` backend: whether the API token holds every privilege pvegpu needs on this node's
    paths (`GET /access/permissions`, plan/privileges.py), each missing one named with its path; and who
    writes the root-only keys."""
    pve = plan.specs.pve
    if pve.backend != "https" or pve.token_id is None:
        return
    root = "root's pvesh over SSH (pve.root_ssh)" if pve.root_user else "nobody (pve.root_ssh: false)"
    logger.info(f"{host.print_prefix}keys only root@pam may set are written by {root}")
    required = required_privileges(node_ids(plan.specs, plan.mapping_ids))
    try:
        api = pve_client(host)
        granted = {path: api.permissions(path) for path in acl_paths(required)}
    except (PveError, PveSetupError) as error:
        line = error.line if isinstance(error, PveError) else str(error)
        logger.warning(f"{host.print_prefix}API token {pve.token_id}: privileges not read: {line}")
        return
    missing = missing_privileges(required, granted)
    log = logger.warning if missing else logger.info
    log(f"{host.print_prefix}{privileges_report(pve.token_id, required, missing)}")


def _mmio_window(plan: NodePlan) -> None:
    """Print the 64-bit MMIO window the VM's guest gets (plan/mmio.py), or why it cannot hold the BARs."""
    window, vm = plan.mmio, plan.specs.vm
    if window is None or vm is None:
        return
    if window.problem is not None:
        logger.warning(f"{host.print_prefix}VM {vm.vmid}: vm.mmio: {window.problem}")
        return
    logger.info(f"{host.print_prefix}VM {vm.vmid}: {window.guest}")


def _numa_layout(plan: NodePlan) -> None:
    """Print the VM's NUMA layout pvegpu plans (plan/numa.py), why, and its keys; or why it has none."""
    if plan.numa is None:
        logger.warning(f"{host.print_prefix}VM NUMA layout: {plan.numa_problem}")
        return
    keys = ", ".join(f"{key}: {value}" for key, value in plan.numa.keys().items())
    logger.info(f"{host.print_prefix}VM NUMA layout {plan.numa.layout} ({plan.numa.reason}): {keys}")


def _gpu_topology(spec: NodeSpec, topology: Topology) -> None:
    """Print the node's GPUs (cards, IOMMU groups, root buses, NUMA nodes, links, verdicts)."""
    report = render_table(topology)
    log = logger.info if topology.ok else logger.warning
    log(f"{host.print_prefix}GPU topology of node {spec.name} (profile {spec.profile}):\n{report}")


def _host_checks(plan: NodePlan) -> None:
    """Print IOMMU / interrupt remapping, ACS above each GPU (on `lxc` / `baremetal` also its DMA
    translation), BARs, Resizable BAR, C-states, NUMA nodes and the BIOS knobs Linux cannot see; write the
    same as JSON to `$PVEGPU_DOCTOR_DIR/<host>.json` (default ./pvegpu-doctor/) on this machine."""
    spec = plan.specs.node
    rows = host_checks(plan.hardware, plan.topology, host_check_data(host), spec.profile)
    path = Path(os.environ.get(REPORT_DIR_ENV, REPORT_DIR)) / f"{host.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(checks_to_json(host.name, rows), indent=1) + "\n")
    logger.info(
        f"{host.print_prefix}host checks of node {spec.name} (also in {path}):\n{render_checks(rows)}"
    )


def _mapping_health(plan: NodePlan) -> None:
    """Print whether the VM's mappings (`<prefix><N>`) are valid on this node, renumber-only drift, or
    hardware changed, with one line per GPU: the decision the pre-start hook's repair would make (`plan_heal`,
    with the inventory's owner: a mapping without pvegpu's mark is not repaired), never made."""
    vm, node = plan.specs.vm, plan.specs.node.name
    assert vm is not None  # the caller's condition
    subject = f"PCI mappings of VM {vm.vmid} ({vm.name}) on node {node}"
    try:
        states = pve_client(host).mappings()
    except (PveError, PveSetupError) as error:
        line = error.line if isinstance(error, PveError) else str(error)
        logger.warning(f"{host.print_prefix}{subject}: not read: {line}")
        return
    pve = plan.specs.pve
    owner = owner_id(pve.owner, pve.cluster, node)  # the hook repairs only mappings with this mark
    healed = plan_heal(node, [state.mapping for state in states], plan.hardware, plan.mapping_prefix, owner)
    if not healed.gpus:
        logger.warning(
            f"{host.print_prefix}{subject}: none ({plan.mapping_prefix}<N>) yet; "
            "`pyinfra inventory.py deploy/vm.py` creates them"
        )
        return
    log = logger.info if healed.health is Health.VALID else logger.warning
    lines = "".join(f"\n  {line}" for line in healed.findings)
    log(f"{host.print_prefix}{subject}: {healed.health.value}{_HEALTH_ADVICE[healed.health]}{lines}")


def _hook_status(plan: NodePlan) -> None:
    """Print whether the VM's pre-start hookscript (vm.self_heal) is installed and current: the VM's
    `hookscript` names it, and the wrapper and zipapp on the node are the bytes this pvegpu would write."""
    vm, node = plan.specs.vm, plan.specs.node
    assert vm is not None  # the caller's condition
    subject = f"pre-start hook of VM {vm.vmid} (vm.self_heal {vm.self_heal})"
    try:
        api = pve_client(host)
        current = api.vm_config(node.name, vm.vmid).values.get("hookscript")
        directory = api.storage(vm.snippets_storage).path
    except (PveError, PveSetupError) as error:
        line = error.line if isinstance(error, PveError) else str(error)
        logger.warning(f"{host.print_prefix}{subject}: not read: {line}")
        return
    problems = _hook_problems(plan, current, directory)
    if not problems:
        state = "off" if vm.self_heal == "off" else "installed and current"
        logger.info(f"{host.print_prefix}{subject}: {state}")
        return
    fix = "`pyinfra inventory.py deploy/vm.py` fixes it"
    logger.warning(f"{host.print_prefix}{subject}: {'; '.join(problems)} ({fix})")


def _hook_problems(plan: NodePlan, current: object, directory: str | None) -> list[str]:
    vm, node, pve = plan.specs.vm, plan.specs.node, plan.specs.pve
    assert vm is not None
    if vm.self_heal == "off":
        return [f"the VM still runs pvegpu's hookscript {current}"] if is_pvegpu_hookscript(current) else []
    problems = [] if current == hookscript_volid(vm) else [f"the VM's hookscript is {current or 'not set'}"]
    bundle = build()
    owner = owner_id(pve.owner, pve.cluster, node.name)
    text = wrapper(
        bundle, mode=vm.self_heal, prefix=vm.mapping_prefix, owner=owner, sysfs_root=str(node.sysfs_root)
    )
    for path, data in ((f"{directory}/snippets/{HOOKSCRIPT}", text.encode()), (BUNDLE_PATH, bundle.data)):
        found = file_sha256(host, path)
        if found is None:
            problems.append(f"{path} is missing")
        elif found != hashlib.sha256(data).hexdigest():
            problems.append(f"{path} is not pvegpu {bundle.version}'s")
    return problems
