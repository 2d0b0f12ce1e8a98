"""Doctor: a read-only report of each node. It reads (the host's plan; pvegpu/run/reports.py and, through the
Proxmox API, pvegpu/run/doctor_reads.py), judges with pvegpu/plan/doctor.py and prints; it never changes a
host."""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.cli.report import render_table
from pvegpu.models.node import NodeSpec
from pvegpu.plan.cmdline import HOST_P2P_PROFILES
from pvegpu.plan.doctor import (
    hook_status,
    mapping_health,
    mmio_window,
    numa_layout,
    privileges_findings,
    token_check,
)
from pvegpu.plan.host_checks import host_checks, render_checks
from pvegpu.plan.node import NodePlan
from pvegpu.plan.topology import Topology
from pvegpu.run.doctor_reads import granted_privileges, hook_read, vm_mappings
from pvegpu.run.plan import plan_of
from pvegpu.run.reports import host_check_data, log_findings, log_next_boot, save_host_checks


@deploy("Report the node")
def node_report() -> None:
    """The GPU topology and the host checks, from two remote commands (`PciHardware`, `HostChecks`); on a
    host serving from its own NVIDIA driver, its next boot's kernel and module (plan/kernel_guard.py); on a
    Proxmox node the API token's privileges (`https`), and with `vm` data the health of its VM's PCI
    mappings and pre-start hook, read through the API, its NUMA layout and MMIO window
    (pvegpu/plan/doctor.py).

    The hardware and topology come from the host's plan (read once per run).
    """
    plan = plan_of(host)
    _gpu_topology(plan.specs.node, plan.topology)
    _host_checks(plan)
    if plan.specs.node.profile in HOST_P2P_PROFILES:
        log_next_boot(host, plan.specs.driver.version, proxmox=plan.is_pve_node)
    if plan.is_pve_node:
        _token_privileges(plan)
    if plan.is_pve_node and plan.specs.vm is not None:
        log_findings(host, mapping_health(plan, vm_mappings(host)))
        log_findings(host, hook_status(plan.specs.vm, hook_read(host, plan)))
        log_findings(host, numa_layout(plan))
        log_findings(host, mmio_window(plan))


def _token_privileges(plan: NodePlan) -> None:
    """With the `https` backend: who writes the root-only keys, and whether the API token holds every
    privilege pvegpu needs on this node's paths (`GET /access/permissions`), each missing one named."""
    check = token_check(plan)
    if check is not None:
        log_findings(host, privileges_findings(check, granted_privileges(host, check.paths)))


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
    path = save_host_checks(host, rows)
    logger.info(
        f"{host.print_prefix}host checks of node {spec.name} (also in {path}):\n{render_checks(rows)}"
    )
