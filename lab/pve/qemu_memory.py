"""A lab VM start's memory options as qemu-server builds them (src/PVE/QemuServer/Memory.pm `config`, without
memory hotplug): `-m`, the NUMA nodes' RAM objects and `-numa node`, and with a virtiofsN the shared memory
vhost-user needs (a `memory-backend-memfd` with `share=on`: the NUMA nodes' `virtiofs-memN`, or without NUMA
one `virtiofs-mem` the machine uses, `-machine memory-backend=virtiofs-mem`). LAB STAND-IN; this is NOT
Proxmox."""

from __future__ import annotations

import re
from collections.abc import Mapping

from lab.pve.qemu_config import QemuCmdlineError, as_bool, parse_property_string

MAX_NUMA = 8  # Memory.pm $MAX_NUMA


def _memory_mib(conf: Mapping[str, str]) -> int:
    match = re.match(r"(?:current=)?(\d+)", conf.get("memory", "512"))
    return int(match.group(1)) if match else 512


def _hugepage_kib(conf: Mapping[str, str], size_mib: float) -> int:
    """Memory.pm hugepages_size: `2` 2 MiB pages, `1024` 1 GiB, `any` 1 GiB when the size is a multiple."""
    pages = conf["hugepages"]
    if pages == "any":
        return 1048576 if size_mib % 1024 == 0 else 2048
    return int(pages) * 1024


def _mem_object(conf: Mapping[str, str], memdev: str, size: str) -> str:
    """Memory.pm print_mem_object: hugepages' file backend, virtiofs' memfd, else RAM."""
    if conf.get("hugepages"):
        path = f"/run/hugepages/kvm/{_hugepage_kib(conf, float(size))}kB"
        return f"memory-backend-file,id={memdev},size={size}M,mem-path={path},share=on,prealloc=yes"
    if memdev.startswith("virtiofs-mem"):
        return f"memory-backend-memfd,id={memdev},size={size}M,share=on"
    return f"memory-backend-ram,id={memdev},size={size}M"


def _numa_cpus(text: str) -> str:
    return ",cpus=".join(text.split(";"))


def _custom_node(conf: Mapping[str, str], index: int, memdev: str) -> tuple[float, list[str]]:
    """A numaN node's memory (MiB) and its `-object` and `-numa node` parts."""
    numa = parse_property_string(conf[f"numa{index}"])
    if not numa.get("memory"):
        raise QemuCmdlineError(f"missing NUMA node{index} memory value")
    mem_object = _mem_object(conf, memdev, numa["memory"])
    if "cpus" not in numa:
        raise QemuCmdlineError(f"missing NUMA node{index} cpus")
    if "hostnodes" in numa:
        hostnodes = numa["hostnodes"].replace(";", ",")
        if "policy" not in numa:
            raise QemuCmdlineError(f"you need to define a policy for hostnode {hostnodes}")
        mem_object += f",host-nodes={hostnodes},policy={numa['policy']}"
    elif conf.get("hugepages"):
        raise QemuCmdlineError("numa hostnodes need to be defined to use hugepages")
    node = f"node,nodeid={index},cpus={_numa_cpus(numa['cpus'])},memdev={memdev}"
    return float(numa["memory"]), ["-object", mem_object, "-numa", node]


def memory_parts(
    conf: Mapping[str, str], sockets: int, cores: int, virtiofs: bool = False
) -> tuple[list[str], list[str]]:
    """`-m` and, with `numa: 1`, each node's RAM object and `-numa node` (the numaN keys, or one node per
    socket without them; with `virtiofs` named `virtiofs-memN`, memfd); without NUMA but with `virtiofs`, the
    `virtiofs-mem` object, sized by the config's raw `memory` value as upstream prints it. Returns the parts
    and the `-machine` flags they need."""
    memory = _memory_mib(conf)
    parts = ["-m", str(memory)]
    if conf.get("hugepages") and not as_bool(conf.get("numa"), False):
        raise QemuCmdlineError("numa needs to be enabled to use hugepages")
    if not as_bool(conf.get("numa"), False):
        if virtiofs:  # kvm: '-machine memory-backend' and '-numa memdev' properties are mutually exclusive
            raw = conf.get("memory", "")
            parts += ["-object", f"memory-backend-memfd,id=virtiofs-mem,size={raw}M,share=on"]
            return parts, ["memory-backend=virtiofs-mem"]
        return parts, []
    ram = "virtiofs-mem" if virtiofs else "ram-node"
    total = 0.0
    for index in range(MAX_NUMA):
        if conf.get(f"numa{index}"):
            size, node = _custom_node(conf, index, f"{ram}{index}")
            total += size
            parts += node
    if total and total != memory:
        raise QemuCmdlineError("total memory for NUMA nodes must be equal to vm static memory")
    if not total:
        size = memory / sockets
        for index in range(sockets):
            first = cores * index
            cpus = f"{first}-{first + cores - 1}" if cores > 1 else str(first)
            printed = str(int(size)) if size == int(size) else str(size)
            parts += ["-object", _mem_object(conf, f"{ram}{index}", printed)]
            parts += ["-numa", f"node,nodeid={index},cpus={cpus},memdev={ram}{index}"]
    return parts, []
