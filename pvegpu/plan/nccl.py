"""NCCL environment and SGLang all-reduce flags for a profile's P2P reality, each with a one-line reason.

Pure. `plan_nccl(profile, topology, infiniband=..., overrides=...)`:

- `vm`: the GPUs are passed through to a Q35 VM where P2P between them is not supported, so NCCL must use
  shared memory (SHM) and SGLang must not assume P2P: `--enable-p2p-check --disable-custom-all-reduce`.
  Nothing that enables or forces P2P is set, and the operator may not set it either (refused, see
  `VM_REFUSED`): forced P2P in a VM hangs NCCL or silently corrupts data (NVIDIA/nccl #2335), and without
  SHM NCCL falls back to sockets. This is a refusal, not a warning, because the VM env file must never
  enable P2P on its own; GPUDirect clique hints are the separate, explicit `vm.p2p` (pvegpu/plan/p2p.py):
  once its probe proved P2P (or with `on`), `p2p=True` keeps `--enable-p2p-check`, drops
  `--disable-custom-all-reduce` and sets `NCCL_P2P_LEVEL=SYS`; the operator's P2P variables stay refused.
- `lxc` / `baremetal`: the host driver gives real P2P. NCCL's default level (PXB: same PCIe switch) keeps
  P2P off between GPUs on separate root complexes, so `NCCL_P2P_LEVEL` is set from the topology: `PHB`
  when every GPU is on one NUMA node, `SYS` when they span several (NCCL's CPU nodes are NUMA nodes).
- `NCCL_TOPO_FILE` where the caller has a topology file for a VM guest (pvegpu/plan/nccl_topo.py).
- Every profile: `NCCL_IB_DISABLE=1` without an InfiniBand/RoCE adapter; `NCCL_DEBUG=INFO` so the
  channel lines `pvegpu.facts.nccl` reads (the transport actually used) reach the journal.

Operator overrides (`SglangSpec.env`) replace or add variables; each says so in its reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pvegpu.models.hardware import HostHardware
from pvegpu.models.nccl import ConfSetting
from pvegpu.models.sglang import SGLANG_KEY
from pvegpu.plan.errors import PlanError
from pvegpu.plan.topology import Topology

Profile = Literal["vm", "lxc", "baremetal"]

CLASS_INFINIBAND = 0x0207
CLASS_ETHERNET = 0x0200
VENDOR_MELLANOX = "15b3"  # ConnectX in Ethernet mode still offers RoCE, which NCCL drives as IB

# Variables an operator may not set in the vm profile, and why.
VM_REFUSED = {
    "NCCL_P2P_LEVEL": "it lets NCCL try P2P, which passed-through GPUs do not support",
    "NCCL_IGNORE_DISABLED_P2P": (
        "it makes NCCL skip or hide its P2P check; "
        "forced P2P in a VM hangs or corrupts data (NVIDIA/nccl #2335)"
    ),
    "NCCL_SHM_DISABLE": "the VM's GPUs talk through shared memory; without it NCCL falls back to sockets",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": (
        "the PCIe-IPC all-reduce needs CUDA P2P, which the VM does not support"
    ),
    "NCCL_CONF_FILE": (
        "NCCL fills every variable the environment leaves unset from that file, "
        "so it could set what the vm profile refuses"
    ),
}

# What a conf file can set of them: NCCL's own variables (it sets them into its process's C environment,
# after SGLang read its own), NCCL_CONF_FILE aside (read from the environment before any file).
_CONF_REFUSED = frozenset(
    name for name in VM_REFUSED if name.startswith("NCCL_") and name != "NCCL_CONF_FILE"
)

P2P_CHECK_PROVEN = (
    "P2P between the VM's GPUs is on (vm.p2p, experimental): SGLang checks each pair again before its "
    "custom all-reduce uses it"
)
P2P_LEVEL_PROVEN = (
    "P2P between the VM's GPUs is on (vm.p2p, experimental): let NCCL use it across root complexes"
)
_PXB_NOTE = "NCCL's default (PXB) would fall back to SHM between root complexes"


@dataclass(frozen=True)
class EnvSetting:
    """One variable of the service environment and why it has this value."""

    name: str
    value: str
    reason: str


def setting_lines(settings: Sequence[EnvSetting]) -> tuple[str, ...]:
    """The env file's lines of `settings`: `# reason`, then `NAME=value`, per variable."""
    return tuple(line for s in settings for line in (f"# {s.reason}", f"{s.name}={s.value}"))


@dataclass(frozen=True)
class FlagSetting:
    """One `sglang serve` flag the profile needs and why."""

    flag: str
    reason: str


@dataclass(frozen=True)
class NcclPlan:
    """The environment (sorted by name) and the SGLang flags (in argv order) for one node."""

    env: tuple[EnvSetting, ...]
    flags: tuple[FlagSetting, ...]

    @property
    def argv(self) -> tuple[str, ...]:
        return tuple(flag.flag for flag in self.flags)

    def env_file_lines(self) -> tuple[str, ...]:
        """`# reason` then `NAME=value` per variable, then `# sglang <flag>: reason` per flag."""
        return (*setting_lines(self.env), *(f"# sglang {flag.flag}: {flag.reason}" for flag in self.flags))


def has_infiniband(hw: HostHardware) -> bool:
    """True when `hw` has an InfiniBand controller or a Mellanox/NVIDIA ConnectX Ethernet function (RoCE)."""
    return any(
        f.class_base == CLASS_INFINIBAND or (f.class_base == CLASS_ETHERNET and f.vendor == VENDOR_MELLANOX)
        for f in hw.functions
    )


def plan_nccl(
    profile: Profile,
    topology: Topology | None,
    *,
    infiniband: bool,
    overrides: Mapping[str, str] | None = None,
    topo_file: str | None = None,
    p2p: bool = False,
) -> NcclPlan:
    """The NCCL environment and SGLang flags for `profile` (see the module docstring for the rules).

    `topology` (the host's GPUs, from `plan_topology`) is needed for `lxc` and `baremetal`; `vm` ignores it.
    `infiniband`: the serving host has an IB/RoCE adapter (`has_infiniband`). `overrides`: the operator's
    variables. `topo_file`: a VM guest's NCCL topology file (pvegpu/plan/nccl_topo.py), set as
    `NCCL_TOPO_FILE`. `p2p` (vm only): P2P between the VM's GPUs is proven by pvegpu's probe, or forced
    with `vm.p2p: on` (pvegpu/plan/p2p.py `guest_uses_p2p`): SGLang keeps its P2P check but its custom
    all-reduce is allowed, and `NCCL_P2P_LEVEL=SYS` lets NCCL use P2P across root complexes.
    Raises PlanError (`sglang.env.<NAME>: ...`, one line each) for an override refused in the vm profile,
    or (`sglang: ...`) when lxc/baremetal get no GPUs to read NUMA nodes from.
    """
    overrides = overrides or {}
    planned: dict[str, EnvSetting] = {}
    flags: tuple[FlagSetting, ...] = ()

    def put(name: str, value: str, reason: str) -> None:
        planned[name] = EnvSetting(name, value, reason)

    if profile == "vm":
        refused = [
            f"{SGLANG_KEY}.env.{name}: refused in the vm profile: {VM_REFUSED[name]}"
            for name in sorted(overrides)
            if name in VM_REFUSED
        ]
        disable = overrides.get("NCCL_P2P_DISABLE")
        if not p2p and disable is not None and _strtol(disable) != 1:
            refused.append(
                f"{SGLANG_KEY}.env.NCCL_P2P_DISABLE: refused in the vm profile: {disable!r} is not 1 to "
                "NCCL, so it lets NCCL try P2P, which the VM's probe has not proven (vm.p2p)"
            )
        if refused:
            refused.sort()
            raise PlanError("\n".join(refused))
        if p2p:
            flags = (FlagSetting("--enable-p2p-check", P2P_CHECK_PROVEN),)
            put("NCCL_P2P_LEVEL", "SYS", P2P_LEVEL_PROVEN)
            _put_p2p_profile(put)
        else:
            _put_shm_profile(put)
            flags = (
                FlagSetting(
                    "--enable-p2p-check",
                    "P2P is not supported between passed-through GPUs; "
                    "without the check SGLang assumes it works",
                ),
                FlagSetting(
                    "--disable-custom-all-reduce",
                    "SGLang's custom all-reduce needs P2P, which the VM lacks; "
                    "NCCL all-reduces over shared memory",
                ),
            )
    else:
        if topology is None or not topology.gpus:
            raise PlanError(f"{SGLANG_KEY}: the {profile} profile needs the host's GPUs for NCCL_P2P_LEVEL")
        put("NCCL_P2P_LEVEL", *_p2p_level(topology))
        _put_p2p_profile(put)
    if topo_file is not None:
        put(
            "NCCL_TOPO_FILE",
            topo_file,
            "the GPUs' host NUMA nodes and PCIe links, which the VM hides (experimental until measured)",
        )
    if not infiniband:
        no_ib = "no InfiniBand/RoCE adapter: skip NCCL's IB probe, use sockets between nodes"
        put("NCCL_IB_DISABLE", "1", no_ib)
    put("NCCL_DEBUG", "INFO", "log each channel's transport (P2P, SHM, NET) so pvegpu's doctor can check it")
    for name, value in overrides.items():
        before = planned.get(name)
        reason = f"set by the operator ({SGLANG_KEY}.env)"
        if before is not None:
            reason += f", replacing the planned {before.value} ({before.reason})"
        put(name, value, reason)
    return NcclPlan(env=tuple(planned[name] for name in sorted(planned)), flags=flags)


def _put_p2p_profile(put: Callable[[str, str, str], None]) -> None:
    """The reference box's NCCL settings where its GPUs have P2P (../knowledge: serving recipe)."""
    put(
        "NCCL_MIN_NCHANNELS",
        "8",
        "8 channels: the reference box's 8-GPU all-reduce reached 37.6-41 GB/s (22 by default)",
    )
    put(
        "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
        "1",
        "LL buffers for send/recv over the network transport (pipeline stages across nodes), as the "
        "reference box's recipe sets (NCCL's default 0)",
    )


def _put_shm_profile(put: Callable[[str, str, str], None]) -> None:
    """The VM's shared-memory path: P2P off for certain, tuned for throughput at high concurrency."""
    put(
        "NCCL_P2P_DISABLE",
        "1",
        "P2P between the VM's GPUs is not proven (vm.p2p); without this NCCL's AMD rule lets 2-GPU groups "
        "(TP4+PP2's pipeline pairs) try it",
    )
    shm = "the SHM path's throughput at high concurrency (experimental until measured on this box)"
    put("NCCL_MIN_NCHANNELS", "32", f"32 channels over shared memory: {shm}")
    put("NCCL_BUFFSIZE", str(8 << 20), f"8 MiB buffers per channel (NCCL's default 4 MiB): {shm}")
    put(
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "64",
        f"64 CUDA work queues (CUDA's default 8) so NCCL's kernels overlap: {shm}",
    )


def _strtol(text: str) -> int:
    """C's `strtol(text, NULL, 0)` as NCCL reads NCCL_P2P_DISABLE: leading space, a sign, 0x hex, 0 octal,
    digits up to the first that does not fit; 0 where none does."""
    match = re.match(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", text)
    if match is None:
        return 0
    sign, digits = match.groups()
    base = 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") else 10
    return int(f"{sign}{digits}", base)


def conf_file_problems(
    profile: Profile, plan: NcclPlan, files: Mapping[str, Sequence[ConfSetting] | None]
) -> tuple[str, ...]:
    """`<file>:<line>: <NAME> is refused in the vm profile: <reason> (...)` for each setting of an NCCL conf
    file (`files`: path -> its settings, None when absent) that NCCL would apply in a `vm` guest: a
    variable `VM_REFUSED` names that the service's environment (`plan`) leaves unset. () otherwise."""
    if profile != "vm":
        return ()
    planned = {setting.name for setting in plan.env}
    problems = []
    for path, settings in files.items():
        for setting in settings or ():
            name = setting.name
            if name in _CONF_REFUSED and name not in planned:
                problems.append(
                    f"{path}:{setting.line}: {name} is refused in the vm profile: {VM_REFUSED[name]} "
                    "(NCCL reads this file for every variable the service's environment leaves unset; "
                    "remove the line)"
                )
    return tuple(problems)


def _p2p_level(topology: Topology) -> tuple[str, str]:
    nodes = sorted({gpu.numa_node for gpu in topology.gpus}, key=lambda node: (node is None, node or 0))
    shown = ", ".join("unknown" if node is None else str(node) for node in nodes)
    if len(nodes) > 1:
        return "SYS", f"GPUs on NUMA nodes {shown}: allow P2P across the CPU interconnect ({_PXB_NOTE})"
    where = "one NUMA node" if nodes[0] is None else f"NUMA node {nodes[0]}"
    return "PHB", f"all GPUs on {where}: allow P2P through the CPU's host bridges ({_PXB_NOTE})"
