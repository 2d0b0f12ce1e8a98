"""GPU peer-to-peer inside the VM (`vm.p2p`): the clique, its `args` parts, the probe's verdict. Pure.

QEMU's vfio-pci property `x-nv-gpudirect-clique` tells the guest's NVIDIA driver which passed-through GPUs
may talk peer to peer. It can work, hang, or silently corrupt data (NVIDIA/nccl #2335), so `vm.p2p`:

- `off` (default): no clique part in `args` (pvegpu removes its own), the SHM plan (pvegpu/plan/nccl.py);
- `probe`: the clique is set for a probe in the guest (pvegpu/operations/p2p.py) and kept only when every
  check passes and P2P beats SHM (`judge`); the verdict is recorded on the guest with what it depends on
  (`pvegpu.models.p2p`), and only a passed probe's record gives the guest the P2P plan (`guest_uses_p2p`);
- `on`: the clique without a probe; every run warns that P2P is on unproven.

The clique: the GPUs that may peer are those under one host root complex; on an AMD host every GPU of the
VM, since its data fabric carries P2P between root complexes (bare-metal P2P on the reference box). One
clique id per group of two GPUs or more, 0..15 (NVIDIA's range). Each part addresses the device as
qemu-server names it: `-set device.hostpciN.x-nv-gpudirect-clique=C`. QEMU's `-set group.id.prop=value`
splits on dots (`qemu_set_option`), so the id must have none: a GPU that gets a clique is passed
single-function (its mapping's path names the display function, `0000:41:00.0`, plan/mapping.py), which
qemu-server names `hostpciN`; a function-less path passes every function of the slot and names them
`hostpciN.0`, `hostpciN.1`, ... (qemu-server PCI.pm `print_hostpci_devices`: `$mf_addr`), which `-set` cannot
reach — shared/knowledge/proxmox-hostpci-vm-config.md §2. pvegpu's parts of an earlier version,
`-set device.hostpciN.0.x-nv-...` (read by QEMU as device `hostpciN`, property `0.x-nv-...`: the VM never
starts), are recognised as pvegpu's too, so they are replaced or removed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pvegpu.models.p2p import P2pMode, Record, Verdict
from pvegpu.plan.topology import Topology

MAX_CLIQUE = 15  # the property's range is 0..15
PROBE_PATH = "/usr/local/lib/pvegpu/p2p_probe.py"
# pvegpu's own clique parts: `-set device.hostpci<N>.x-nv-gpudirect-clique=<C>`, and the `hostpci<N>.0.` form
# an earlier pvegpu wrote (never started: removed or replaced). Any other part of `args` is the operator's.
CLIQUE_PART = re.compile(r"\s*-set\s+device\.hostpci(\d+)(\.0)?\.x-nv-gpudirect-clique=\d+")
UNPROVEN = (
    "vm.p2p is on: GPU peer-to-peer is enabled in the VM without a probe (unproven; it can hang NCCL or "
    "silently corrupt data, NVIDIA/nccl #2335): use vm.p2p: probe to have it checked"
)
NO_VENV = "P2P probe pending: the guest has no SGLang venv yet"
NO_DRIVER = "P2P probe pending: the guest has no NVIDIA driver yet"
DEFERRED = (
    "P2P probe deferred: this run also converges the guest, which the VM's restart would cut off; "
    "run deploy/vm.py to probe"
)


def plan_cliques(topology: Topology, cpu_vendor: str | None) -> tuple[tuple[int, ...], ...]:
    """The VM's GPUs (hostpci indexes, in `topology.gpus` order) grouped into cliques: one group of every
    GPU on an AMD host, else one per root complex; groups of one GPU are left out (nothing to peer with),
    and more than 16 groups keep the first 16."""
    if cpu_vendor == "amd":
        groups: list[list[int]] = [list(range(len(topology.gpus)))]
    else:
        by_root: dict[str, list[int]] = {}
        for index, gpu in enumerate(topology.gpus):
            by_root.setdefault(gpu.root_bus, []).append(index)
        groups = list(by_root.values())
    return tuple(tuple(group) for group in groups if len(group) >= 2)[: MAX_CLIQUE + 1]


def clique_args(cliques: Sequence[Sequence[int]]) -> str:
    """`-set device.hostpci<N>.x-nv-gpudirect-clique=<C>` for every GPU of clique C (C = its position)."""
    return " ".join(
        f"-set device.hostpci{index}.x-nv-gpudirect-clique={clique}"
        for clique, group in enumerate(cliques)
        for index in group
    )


def own_clique(current: str | None) -> str:
    """pvegpu's clique parts of `current` args (either form), in order, one space apart ('' when none)."""
    return " ".join(match[0].strip() for match in CLIQUE_PART.finditer(current or ""))


def clique_devices(args: str | None) -> frozenset[int]:
    """The hostpci indexes pvegpu's clique parts of `args` name in the form QEMU can reach: the GPUs to pass
    single-function (a part of the earlier `hostpciN.0.` form names none: it is replaced or removed)."""
    return frozenset(int(match[1]) for match in CLIQUE_PART.finditer(args or "") if match[2] is None)


def single_function_gpus(mode: P2pMode, planned: str, config_args: str | None) -> frozenset[int]:
    """The hostpci indexes (= GPU indexes) of a node's VM whose mappings name the display function: with
    `on` those of the `planned` clique; with `probe` those the VM's config (`config_args`, pending values
    applied: what its next start gets) holds a clique part for, since the probe sets and removes the clique
    and the path shape together (pvegpu/operations/p2p.py); with `off` none, so the original whole-slot
    paths come back."""
    if mode == "on":
        return clique_devices(planned)
    if mode == "probe":
        return clique_devices(config_args)
    return frozenset()


def vm_devices(config: Mapping[str, object], clique: str) -> str:
    """The VM's GPU devices as an identity: `hostpciN=<value>` sorted by N, then the clique parts."""
    keys = sorted((key for key in config if re.fullmatch(r"hostpci\d+", key)), key=lambda k: int(k[7:]))
    return "; ".join([*(f"{key}={config[key]}" for key in keys), clique])


@dataclass(frozen=True)
class Judgement:
    """The probe's verdict: `p2p` when every check passed and P2P beat SHM; else `shm` with one line per
    failure (naming the pair or rank and how it failed)."""

    verdict: Verdict
    failures: tuple[str, ...]
    summary: str


def judge(result: Mapping[str, Any]) -> Judgement:
    """The verdict from the probe's JSON (pvegpu/data/p2p/p2p_probe.py `run`): every GPU pair reports peer
    access both ways and its checksummed copies both ways match; the NCCL all-reduce with P2P and with SHM
    (run by the probe only when every pair passed) each gave the right result on every rank; P2P's
    small-message latency is lower than SHM's and its bus bandwidth at least SHM's. Anything missing or
    malformed fails, saying what."""
    try:
        failures = _pair_failures(result["pairs"])
        reduce = result["allreduce"]
        if reduce is None and not failures:
            failures.append("the probe ran no NCCL all-reduce")
        timings: dict[str, tuple[float, float]] = {}
        for transport in () if reduce is None else ("p2p", "shm"):
            failures += _reduce_failures(transport, reduce[transport], timings)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return Judgement("shm", (f"the probe's result is malformed ({error!r})",), "")
    summary = ""
    if len(timings) == 2:
        (p2p_us, p2p_bw), (shm_us, shm_bw) = timings["p2p"], timings["shm"]
        summary = (
            f"all-reduce latency {p2p_us:.1f} us with P2P vs {shm_us:.1f} us with SHM, "
            f"bus bandwidth {p2p_bw:.1f} GB/s vs {shm_bw:.1f} GB/s"
        )
        if not failures and not (p2p_us < shm_us and p2p_bw >= shm_bw):
            failures.append(f"P2P does not beat SHM: {summary}")
    return Judgement("shm" if failures else "p2p", tuple(failures), summary)


def _pair_failures(pairs: Sequence[Mapping[str, Any]]) -> list[str]:
    failures = [] if pairs else ["the probe found fewer than 2 GPUs: nothing peers"]
    for pair in pairs:
        a, b = int(pair["a"]), int(pair["b"])
        for source, target, key in ((a, b, "ab"), (b, a, "ba")):
            if not pair["peer"][key]:
                failures.append(f"GPU {a} <-> GPU {b}: no peer access {source}->{target}")
            elif not pair["copy"][key]:
                failures.append(f"GPU {a} <-> GPU {b}: checksum mismatch copying {source}->{target}")
    return failures


def _reduce_failures(
    transport: str, run: Mapping[str, Any], timings: dict[str, tuple[float, float]]
) -> list[str]:
    """One all-reduce run's failures; its (latency, bus bandwidth) put in `timings` when it ran."""
    name = f"NCCL all-reduce over {transport.upper()}"
    if run.get("error"):
        return [f"{name}: {run['error']}"]
    timings[transport] = (float(run["latency_us"]), float(run["busbw_gbs"]))
    return [f"{name}: wrong result on rank {rank['rank']}" for rank in run["ranks"] if not rank["ok"]]


def timeout_failure(timeout_s: float) -> str:
    """The failure line of a probe that did not end in time (it was killed: P2P hangs)."""
    return f"the probe did not finish within {timeout_s:g} s and was killed: P2P hangs in this VM"


def crash_failure(exit_code: object, stderr: str) -> str:
    """The failure line of a probe that ended without a result."""
    last = (stderr.strip().splitlines() or ["no output"])[-1]
    return f"the probe failed (exit status {exit_code}): {last}"


def guest_uses_p2p(mode: P2pMode | None, record: Record | None) -> bool:
    """Whether a VM guest's NCCL plan uses P2P: its node's `vm.p2p` (None: the node is not in this run's
    inventory, so SHM) is `on`, or `probe` with the guest's record of a passed probe."""
    if mode == "on":
        return True
    return mode == "probe" and record is not None and record.mode == "probe" and record.verdict == "p2p"


def not_started_failure(start_error: str) -> str:
    """The failure line recorded when the VM did not start with the clique (`start_error`: the start's own
    error line)."""
    return f"the VM did not start with the GPUDirect clique: {start_error}"
