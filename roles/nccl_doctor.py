"""nccl_doctor: the read-only NCCL report of a serving host (deploy/doctor.py): the NCCL profile in force,
the transports the running SGLang service uses, checked against it; on a VM guest also what NCCL logged with
and without its topology file (`NCCL_TOPO_FILE`), read from the service's journal (why there:
`pvegpu.facts.nccl_journal`; the reads: pvegpu/run/reports.py).
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.plan.errors import PlanError
from pvegpu.run.plan import plan_of
from pvegpu.run.reports import log_findings, nccl_topology_report, nccl_transport_findings
from pvegpu.run.serving import serving_nccl


@deploy("Report the NCCL transports SGLang uses")
def nccl_transports() -> None:
    """Read-only: the NCCL profile in force (the plan the sglang role writes, pvegpu.run.serving), the
    transport per rank pair from the running service's NCCL log, and a warning for each pair that
    contradicts that plan (vm: SHM unless P2P is proven; lxc/baremetal: P2P). On a VM guest, first the latest
    run with the topology file and the latest without it, each with what NCCL said of the file and its
    transports: the runs the operator compares (README, "measure each step")."""
    plan = plan_of(host)
    node = plan.specs.node
    try:
        serving = serving_nccl(host)
    except PlanError as error:
        logger.warning(f"{host.print_prefix}NCCL plan: {error}")
        serving = None
    if serving is not None:
        logger.info(f"{host.print_prefix}{serving.describe(node.profile)}")
    if node.profile == "vm":
        for block in nccl_topology_report(host):
            logger.info(f"{host.print_prefix}{block}")
    log_findings(host, nccl_transport_findings(host, None if serving is None else serving.p2p))
