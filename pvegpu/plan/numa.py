"""The VM's NUMA layout from the hardware fact: `plan_numa(spec, hardware, gpus) -> NumaPlan`. Pure.

`vm.numa_layout: host` gives the guest one NUMA node per host NUMA node that holds the VM's GPUs, in host
node order (guest node N is `numaN`):

    sockets: <guest nodes>            cores: <vm.cores / guest nodes>
    numaN: cpus=<a>-<b>,hostnodes=<host node>,memory=<MiB>,policy=bind
    affinity: <those host nodes' CPUs less host_reserved_cores>   (Proxmox's pve-cpuset, `0-31,64-95`)

Guest vCPUs are numbered socket by socket, so guest node N holds socket N's cores: the `cpus` ranges and
`sockets`/`cores` agree. The vCPUs split evenly (Proxmox gives every socket the same `cores`; a `vm.cores`
that does not divide is refused) and `memory` in proportion to them, in whole hugepages when `vm.hugepages`
is set; a remainder goes to the lowest guest nodes. `policy=bind`: the guest node's RAM comes from its host
node only (QEMU `host-nodes=N,policy=bind`), never from the far socket.

Default (`numa_layout` None): `host` when the host reports 2+ NUMA nodes (several sockets, or NPS/SNC
modes) and every GPU of the VM knows its node (sysfs `numa_node` is not -1); else `flat`. `flat` is
pvegpu's earlier config: one socket of `vm.cores`, no `numaN`, no `affinity`. pvegpu owns `numaN`: keys it
no longer plans are deleted (a stale `numa1` would break Proxmox's sum check). With `flat`, an `affinity`
is left as it is (it contradicts nothing; delete it with `qm set <vmid> --delete affinity`).

Proxmox lets only root@pam set `affinity` (API2/Qemu.pm: `only root can set 'affinity' config`; `numaN`
need only VM.Config.CPU): an API token's run sets it through root's pvesh on the node
(pvegpu.pve `RootRouted`). Without a root path (`root_user` None) the default layout has no `affinity`, and
says so in its reason; an explicit `numa_layout: host` or `host_reserved_cores` was refused at inventory
validation then (pvegpu.models.root_only_features).

`host_reserved_cores` (None: the first CPU of each host node the VM uses) stays out of `affinity`: CPU 0
and each node's first CPU carry much of the host's housekeeping (timers, RCU, many IRQs, pvegpu's own
SSH sessions) and QEMU's I/O threads should not compete with it. Proxmox's `affinity` is one set for all of
QEMU's threads (`taskset --cpu-list --all-tasks`): it cannot pin guest node N's vCPUs to host node N; the
memory binding is exact, the vCPU placement is the host scheduler's within the set.

Hugepages (qemu-server Memory.pm): at every start Proxmox computes, per `numaN`, `memory / page size`
pages on its one `hostnodes` node (more than one is refused: `more than 1 hostnode value in numa node is
not supported when hugepages are enabled`), writes the missing ones into
`/sys/devices/system/node/node<N>/hugepages/hugepages-<kB>kB/nr_hugepages`, fails the start with
`hugepage allocation failed` (rolling back) when the kernel cannot give them, and frees them after the VM
stops unless `keephugepages`. `any` takes 1 GiB pages for a node whose memory is a multiple of 1024 MiB,
else 2 MiB pages. pvegpu checks what it can know before a start: every node's memory is a whole number of
pages (else it refuses), one host node per guest node, and host node numbers of one digit (Memory.pm's
`^(\\d)$`); whether the host has the free pages is known only when Proxmox allocates them at the start.

PCIe expander buses: Proxmox does not let the guest see its GPUs' NUMA nodes. qemu-server puts every
`hostpciN` with `pcie=1` on a root port of the root bus `pcie.0` (`ich9-pcie-port-<N+1>`, PCI.pm
`print_hostpci_devices`), with no option for a `pxb-pcie` expander or its `numa_node` (its source names no
pxb at all). Building one through `args` (`-device pxb-pcie,numa_node=N` plus `-set
device.hostpciN.bus=...`) would move devices behind Proxmox's back (its bus bookkeeping, hotplug and the
OVMF MMIO sizing assume pcie.0), so pvegpu does not. Inside the guest the GPUs show `numa_node` -1; NCCL
learns their host nodes only from the topology file pvegpu writes (issue 16 item 2, `NCCL_TOPO_FILE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve_root_only import ROOT_USER
from pvegpu.models.vm import VmSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.topology import GpuCard

MAX_NUMA = 8  # qemu-server Memory.pm $MAX_NUMA: numa0..numa7
ONE_GIB_PAGE_MIB = 1024


@dataclass(frozen=True)
class GuestNode:
    """Guest NUMA node `index` (`numa<index>`): vCPUs `first_cpu`..`last_cpu`, `memory_mib` bound to
    host node `host_node`; with hugepages `pages` of `page_mib` each on that host node."""

    index: int
    host_node: int
    first_cpu: int
    last_cpu: int
    memory_mib: int
    page_mib: int | None = None

    @property
    def pages(self) -> int:
        return 0 if self.page_mib is None else self.memory_mib // self.page_mib

    @property
    def value(self) -> str:
        """The `numaN` value as Proxmox stores it (keys in its format's order: cpus, hostnodes, memory,
        policy)."""
        cpus = str(self.first_cpu) if self.first_cpu == self.last_cpu else f"{self.first_cpu}-{self.last_cpu}"
        return f"cpus={cpus},hostnodes={self.host_node},memory={self.memory_mib},policy=bind"


@dataclass(frozen=True)
class NumaPlan:
    """The layout chosen (`host` | `flat`), why, and the keys it gives the VM config."""

    layout: str
    reason: str
    sockets: int
    cores: int
    nodes: tuple[GuestNode, ...] = ()
    affinity: str | None = None

    def keys(self) -> dict[str, str]:
        """`sockets`, `cores`, and with `host` the `numaN` keys and `affinity`."""
        keys = {"sockets": str(self.sockets), "cores": str(self.cores)}
        keys |= {f"numa{node.index}": node.value for node in self.nodes}
        if self.affinity is not None:
            keys["affinity"] = self.affinity
        return keys


def plan_numa(
    spec: VmSpec, hardware: HostHardware, gpus: Sequence[GpuCard], root_user: str | None = ROOT_USER
) -> NumaPlan:
    """The VM's NUMA plan (module docstring); `root_user` is who writes root-only keys
    (`PveApiSpec.root_user`; None: nobody, so no `affinity`). Raises PlanError naming the `vm.` field for a
    layout `host` that cannot be built: a GPU without a NUMA node, a host node without CPUs, more than 8
    guest nodes, `cores` that do not split evenly, memory that is not whole hugepages per node, or an empty
    affinity."""
    layout = spec.numa_layout or _default_layout(spec, hardware, gpus)
    if layout == "flat":
        reason = "vm.numa_layout: flat" if spec.numa_layout else _flat_reason(spec, hardware)
        return NumaPlan("flat", reason, sockets=1, cores=spec.cores)
    unknown = [gpu.name for gpu in gpus if gpu.numa_node is None]
    if unknown or not gpus:
        seen = ", ".join(unknown) if unknown else "no GPUs"
        raise PlanError(f"vm.numa_layout: host needs every GPU's NUMA node; sysfs numa_node is -1 for {seen}")
    host_nodes = sorted({gpu.numa_node for gpu in gpus if gpu.numa_node is not None})
    cpus_of = {node.node: node.cpus for node in hardware.numa_nodes}
    for node in host_nodes:
        if not cpus_of.get(node):
            raise PlanError(
                f"vm.numa_layout: host: the GPUs' NUMA node {node} has no CPUs in "
                f"/sys/devices/system/node/node{node}/cpulist"
            )
    count = len(host_nodes)
    if count > MAX_NUMA:
        raise PlanError(f"vm.numa_layout: host: the GPUs sit on {count} NUMA nodes; Proxmox has numa0-numa7")
    if spec.cores % count:
        raise PlanError(
            f"vm.cores: {spec.cores} vCPUs do not split evenly over the {count} NUMA nodes holding the "
            f"VM's GPUs (nodes {', '.join(map(str, host_nodes))}): give a multiple of {count}"
        )
    cores = spec.cores // count
    page = _page_mib(spec)
    if page is not None and any(node > 9 for node in host_nodes):  # Memory.pm reads one digit: ^(\d)$
        raise PlanError(
            "vm.hugepages: Proxmox takes hugepages only from host NUMA nodes 0-9 (its hugepages topology "
            f"reads one digit); the GPUs sit on nodes {', '.join(map(str, host_nodes))}"
        )
    memory = _split_memory(spec, [cores] * count, page)
    nodes = tuple(
        GuestNode(
            index,
            host,
            index * cores,
            index * cores + cores - 1,
            memory[index],
            _node_page(spec, memory[index]),
        )
        for index, host in enumerate(host_nodes)
    )
    reserved = (
        {cpus_of[node][0] for node in host_nodes}
        if spec.host_reserved_cores is None
        else set(spec.host_reserved_cores)
    )
    allowed = sorted({cpu for node in host_nodes for cpu in cpus_of[node]} - reserved)
    if not allowed:
        raise PlanError(
            "vm.host_reserved_cores: leaves no CPU of the GPUs' NUMA nodes "
            f"({', '.join(map(str, host_nodes))}) for the VM"
        )
    reason = "vm.numa_layout: host" if spec.numa_layout else _host_reason(hardware, host_nodes)
    if root_user is None:
        reason += "; no affinity: only root@pam can set it, and pvegpu has no root path to the node"
        return NumaPlan("host", reason, sockets=count, cores=cores, nodes=nodes)
    return NumaPlan("host", reason, sockets=count, cores=cores, nodes=nodes, affinity=cpuset(allowed))


def _default_layout(spec: VmSpec, hardware: HostHardware, gpus: Sequence[GpuCard]) -> str:
    known = bool(gpus) and all(gpu.numa_node is not None for gpu in gpus)
    return "host" if spec.numa and known and len(hardware.numa_nodes) >= 2 else "flat"


def _flat_reason(spec: VmSpec, hardware: HostHardware) -> str:
    if not spec.numa:
        return "default: vm.numa is false"
    if len(hardware.numa_nodes) < 2:
        return f"default: the host has {len(hardware.numa_nodes)} NUMA node(s)"
    return "default: not every GPU knows its NUMA node"


def _host_reason(hardware: HostHardware, host_nodes: Sequence[int]) -> str:
    return (
        f"default: the host has {len(hardware.numa_nodes)} NUMA nodes; "
        f"the VM's GPUs sit on {', '.join(f'node{n}' for n in host_nodes)}"
    )


def _page_mib(spec: VmSpec) -> int | None:
    """The hugepage size Proxmox will use per node (`any`: 1 GiB when vm.memory is a multiple of 1 GiB)."""
    if spec.hugepages is None:
        return None
    if spec.hugepages == "any":
        return ONE_GIB_PAGE_MIB if spec.memory % ONE_GIB_PAGE_MIB == 0 else 2
    return int(spec.hugepages)


def _node_page(spec: VmSpec, memory_mib: int) -> int | None:
    """The page size Proxmox takes for a node's memory (Memory.pm hugepages_size; `any` decides per node)."""
    if spec.hugepages == "any":
        return ONE_GIB_PAGE_MIB if memory_mib % ONE_GIB_PAGE_MIB == 0 else 2
    return None if spec.hugepages is None else int(spec.hugepages)


def _split_memory(spec: VmSpec, vcpus: Sequence[int], page: int | None) -> list[int]:
    """vm.memory split over the guest nodes in proportion to their vCPUs, in whole `page`s (1 MiB without
    hugepages); the remainder's pages go to the lowest nodes. Raises PlanError when it cannot be whole."""
    granule = page or 1
    if spec.memory % granule:
        raise PlanError(
            f"vm.memory: {spec.memory} MiB is not a whole number of {granule} MiB hugepages "
            f"(vm.hugepages: {spec.hugepages})"
        )
    units, total = spec.memory // granule, sum(vcpus)
    shares = [units * count // total for count in vcpus]
    for index in range(units - sum(shares)):
        shares[index] += 1
    if page is not None and 0 in shares:
        raise PlanError(f"vm.memory: {spec.memory} MiB gives a NUMA node no whole {page} MiB hugepage")
    return [share * granule for share in shares]


def cpuset(cpus: Sequence[int]) -> str:
    """Ascending CPU ids in Proxmox's pve-cpuset short form (PVE::CpuSet short_string): `0-3,8,10-11`."""
    ranges: list[str] = []
    start = previous = cpus[0]
    for cpu in [*cpus[1:], None]:
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        ranges.append(str(start) if start == previous else f"{start}-{previous}")
        if cpu is not None:
            start = previous = cpu
    return ",".join(ranges)
