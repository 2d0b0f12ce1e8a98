"""What the read-only reports (deploy/doctor.py: roles/doctor.py, roles/nccl_doctor.py, roles/model_doctor.py)
read of a host beyond its plan and state read, each when the report asks for it: the next boot's kernel, the
host checks of the GPUs and their ports, a node file's sha256, the model store, and what the running SGLang
service's NCCL logged. Nothing else reads them; the reports change nothing."""

from __future__ import annotations

from collections.abc import Mapping

from pyinfra.api.host import Host
from pyinfra.facts.files import Sha256File

from pvegpu.facts.host_checks import HostChecks
from pvegpu.facts.model_store import ModelStoreRead
from pvegpu.facts.nccl_journal import topology_file_report
from pvegpu.facts.next_boot import NextBoot
from pvegpu.facts.sglang import SglangNcclChannels, SglangNcclRuns
from pvegpu.models.boot import KernelBoot
from pvegpu.models.host_checks import HostCheckData
from pvegpu.models.model_store import ModelRecord, StoreFile
from pvegpu.models.nccl import ChannelTransport
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
