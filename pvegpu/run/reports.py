"""What the read-only reports (deploy/doctor.py: roles/doctor.py, roles/nccl_doctor.py, roles/model_doctor.py)
read of a host beyond its plan and state read, each when the report asks for it: the next boot's kernel, the
host checks of the GPUs and their ports, a node file's sha256, the model store, and what the running SGLang
service's NCCL logged. Nothing else reads them; the reports change nothing on a host. `log_findings` logs a
report's lines (pvegpu/models/doctor.py `Finding`), `log_next_boot` the next boot's (node and guest doctor);
`save_host_checks` writes the node doctor's JSON file on the operator's machine."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.facts.files import Sha256File

from pvegpu.facts.host_checks import HostChecks
from pvegpu.facts.model_store import ModelStoreRead
from pvegpu.facts.nccl_journal import topology_file_report
from pvegpu.facts.next_boot import NextBoot
from pvegpu.facts.sglang import SglangNcclChannels, SglangNcclRuns
from pvegpu.models.boot import KernelBoot
from pvegpu.models.doctor import Finding
from pvegpu.models.host_checks import HostCheckData
from pvegpu.models.model_store import ModelRecord, StoreFile
from pvegpu.models.nccl import ChannelTransport, summarize
from pvegpu.plan.host_checks import Check, checks_to_json
from pvegpu.plan.kernel_guard import next_boot_report
from pvegpu.plan.nccl_transports import check_transports
from pvegpu.plan.sglang_service import SERVICE
from pvegpu.run.plan import plan_of


def next_boot(target: Host) -> KernelBoot:
    """The kernel `target` boots next and the NVIDIA modules DKMS built for each kernel."""
    return target.get_fact(NextBoot)


def host_check_data(target: Host) -> HostCheckData:
    """The host checks of `target`'s planned GPUs in one command: each GPU and the ports above it, the IOMMU
    groups of the GPUs, interrupt remapping, C-states, NUMA nodes (pvegpu/facts/host_checks.py)."""
    plan = plan_of(target)
    hardware = plan.hardware
    addresses = sorted(
        {
            a
            for gpu in plan.topology.gpus
            for a in (gpu.gpu_function, *hardware.by_address[gpu.gpu_function].parents)
        }
    )
    groups = sorted(
        {
            g
            for gpu in plan.topology.gpus
            if (g := hardware.by_address[gpu.gpu_function].iommu_group) is not None
        }
    )
    return target.get_fact(
        HostChecks,
        sysfs_root=plan.specs.node.sysfs_root,
        addresses=tuple(addresses),
        groups=tuple(groups),
    )


def file_sha256(target: Host, path: str) -> str | None:
    """The sha256 of the file at `path` on `target` now (None: no such file)."""
    return target.get_fact(Sha256File, path=path)


def model_store(target: Host, model_path: str) -> tuple[ModelRecord | None, Mapping[str, StoreFile] | None]:
    """The model fetcher's record in `model_path` on `target` and the directory's file list (one command)."""
    return target.get_fact(ModelStoreRead, model_path=model_path)


def nccl_channels(target: Host) -> tuple[ChannelTransport, ...]:
    """The transport per channel the running SGLang service's NCCL logged."""
    return target.get_fact(SglangNcclChannels)


def nccl_topology_report(target: Host) -> tuple[str, ...]:
    """The latest SGLang run with the NCCL topology file and the latest without it, what NCCL said of the
    file and the transports of each, read from the service's journal (pvegpu/facts/nccl_journal.py)."""
    return topology_file_report(target.get_fact(SglangNcclRuns))


def nccl_transport_findings(target: Host, p2p: bool | None) -> tuple[Finding, ...]:
    """The NCCL transports of `target`'s running SGLang service (its NCCL log): the transport per rank pair
    (info, none without a log), then a warning for each pair that contradicts the profile's plan
    (plan/nccl_transports.py `check_transports`; `p2p`: whether that plan uses P2P, None: no plan)."""
    plan = plan_of(target)
    profile, single_node = plan.specs.node.profile, plan.specs.sglang.nnodes == 1
    records = nccl_channels(target)
    pairs = "\n".join(f"  {pair.describe()}" for pair in summarize(records))
    said = (Finding(f"NCCL transports of {SERVICE} (profile {profile}):\n{pairs}"),) if pairs else ()
    warnings = check_transports(profile, records, single_node=single_node, p2p=p2p)
    return (*said, *(Finding(warning, warning=True) for warning in warnings))


def log_findings(target: Host, findings: Iterable[Finding]) -> None:
    """Each finding as one log line of `target`: a warning, or info."""
    for finding in findings:
        log = logger.warning if finding.warning else logger.info
        log(f"{target.print_prefix}{finding.line}")


def log_next_boot(target: Host, driver_version: str, *, proxmox: bool, installed_only: bool = False) -> None:
    """`next boot: <line>` per line of plan/kernel_guard.py `next_boot_report` on `target`'s next kernel and
    the NVIDIA module `driver_version` (warnings when it lacks it, else info)."""
    boot = next_boot(target)
    ok, lines = next_boot_report(boot, driver_version, proxmox=proxmox, installed_only=installed_only)
    log_findings(target, (Finding(f"next boot: {line}", not ok) for line in lines))


# Where the doctor's JSON reports go on the operator's machine (one file per host); relative to the working
# directory.
REPORT_DIR_ENV = "PVEGPU_DOCTOR_DIR"
REPORT_DIR = "pvegpu-doctor"


def save_host_checks(target: Host, rows: tuple[Check, ...]) -> Path:
    """Write `target`'s host checks as JSON to `$PVEGPU_DOCTOR_DIR/<host>.json` (default ./pvegpu-doctor/)
    on this machine; the path written."""
    path = Path(os.environ.get(REPORT_DIR_ENV, REPORT_DIR)) / f"{target.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(checks_to_json(target.name, rows), indent=1) + "\n")
    return path
