"""Which transport NCCL actually uses between ranks, read from its `NCCL_DEBUG=INFO` channel lines.

Pure. `parse_transports(lines)` keeps one record per channel line and ignores every other line, in
every format NCCL has printed (knowledge: linux-sysfs-lspci-nvidia-nccl-formats.md section 5):

    ... NCCL INFO Ring 00 : 0[1b000] -> 7[41000] via direct shared memory        (NCCL <= 2.12, busId ranks)
    ... NCCL INFO Channel 00 : 1[1] -> 2[2] via SHM/direct/direct                (2.13 .. 2.30.4)
    ... NCCL INFO Channel 00 : 1[1] -> 2[2] via SHM/direct                       (2.30.7+)
    ... NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read                 (also P2P/IPC[/read][/CE],
                                                                                   P2P/direct pointer[/read],
                                                                                   P2P/indirect/R[d][/read])
    ... NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3           (NET/IB/0, .../GDRDMA)

`topology_file_lines(lines)` keeps NCCL's lines about `NCCL_TOPO_FILE` (its ENV subsystem, logged by
default): `NCCL INFO NCCL_TOPO_FILE set by environment to <path>` and `NCCL INFO Could not open XML topology
file <path> : <error>` (`NCCL WARN` before NCCL 2.2x); `topology_file_read` says whether they show NCCL
read the file.

`summarize` folds records per (source rank, destination rank); `check_transports` compares them with
what the profile expects (`vm`: SHM only, P2P is not supported; `lxc`/`baremetal`: P2P) and returns warnings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pvegpu.facts.errors import FactParseError

# The rank's bracket holds the NVML device (NCCL >= 2.18.3) or the busId in hex (older): 1[21000]. Numbers
# are at most 9 ASCII digits: NCCL prints none longer, and int() refuses 4300+ (such a line is not NCCL's).
_CHANNEL = re.compile(
    r"NCCL INFO (?:Channel|Ring) (?P<channel>[0-9]{1,9})(?:/(?P<connection>[0-9]{1,9}))? : "
    r"(?P<src>[0-9]{1,9})\[(?P<src_device>[0-9a-fA-F]+)\] -> "
    r"(?P<dst>[0-9]{1,9})\[(?P<dst_device>[0-9a-fA-F]+)\]"
    r"(?: \[(?P<direction>send|receive)\])? via (?P<detail>.+?)\s*$"
)
_P2P = re.compile(r"P2P/(?:IPC|CUMEM|MNNVL|direct pointer|indirect/\d+\[[0-9a-fA-F]+\])(?:/read)?(?:/CE)?")
_SHM = re.compile(r"SHM/(?:direct|CE)(?:/(?:direct|CE))?|direct shared memory")
_NET = re.compile(r"NET/[^/\s]+/\d+\S*")


# NCCL's ENV lines about its topology file (topo.cc ncclTopoGetSystem, xml.cc ncclTopoGetXmlFromFile: the
# failed open is a WARN before NCCL 2.2x's INFO(NCCL_GRAPH|NCCL_ENV)).
_TOPO_FILE = re.compile(
    r"NCCL INFO (?P<set>NCCL_TOPO_FILE set by environment to \S+)\s*$"
    r"|NCCL (?:INFO|WARN) (?P<failed>Could not open XML topology file \S+ : .+?)\s*$"
)


class Transport(StrEnum):
    P2P = "P2P"  # GPU to GPU over PCIe/NVLink (CUDA IPC, cuMem, same-process pointer, or relayed)
    SHM = "SHM"  # staged through host shared memory: no GPU-to-GPU P2P
    NET = "NET"  # network (sockets, IB): between nodes, or between local GPUs when SHM is off


@dataclass(frozen=True)
class ChannelTransport:
    """One channel line. `src_device`/`dst_device` are the bracketed text (NVML index, or busId in hex on
    NCCL < 2.18.3); `connection` is the `/N` after the channel (None where NCCL prints none: SHM, < 2.14);
    `detail` is everything after `via ` (`P2P/IPC/read`); `line` its 1-based number in the input.
    """

    line: int
    channel: int
    connection: int | None
    src_rank: int
    src_device: str
    dst_rank: int
    dst_device: str
    direction: str | None
    transport: Transport
    detail: str


@dataclass(frozen=True)
class PairTransport:
    """Every channel from `src_rank` to `dst_rank`: transports and details seen (sorted), channel count."""

    src_rank: int
    dst_rank: int
    transports: tuple[Transport, ...]
    details: tuple[str, ...]
    channels: int

    def describe(self) -> str:
        """`ranks 1 -> 2: SHM/direct/direct (4 channels)`."""
        plural = "channel" if self.channels == 1 else "channels"
        return (
            f"ranks {self.src_rank} -> {self.dst_rank}: {', '.join(self.details)} ({self.channels} {plural})"
        )


def parse_transports(lines: Iterable[str]) -> tuple[ChannelTransport, ...]:
    """One record per NCCL channel/ring line, in input order; other lines are ignored (empty input: ()).

    Raises FactParseError naming the line when a channel line names a transport this parser does not know,
    so a new NCCL format is noticed instead of miscounted.
    """
    records = []
    for number, text in enumerate(lines, start=1):
        match = _CHANNEL.search(text)
        if match is None:
            continue
        detail = match["detail"]
        records.append(
            ChannelTransport(
                line=number,
                channel=int(match["channel"]),
                connection=None if match["connection"] is None else int(match["connection"]),
                src_rank=int(match["src"]),
                src_device=match["src_device"],
                dst_rank=int(match["dst"]),
                dst_device=match["dst_device"],
                direction=match["direction"],
                transport=_transport(number, detail),
                detail=detail,
            )
        )
    return tuple(records)


def _transport(number: int, detail: str) -> Transport:
    for pattern, transport in ((_P2P, Transport.P2P), (_SHM, Transport.SHM), (_NET, Transport.NET)):
        if pattern.fullmatch(detail):
            return transport
    raise FactParseError(f"line {number}: unknown NCCL transport {detail!r}")


def topology_file_lines(lines: Iterable[str]) -> tuple[str, ...]:
    """NCCL's lines about its topology file, from `NCCL_TOPO_FILE`/`Could not` on, each once (every rank logs
    them), in order; () when NCCL logged none (the variable is unset)."""
    found: dict[str, None] = {}
    for line in lines:
        match = _TOPO_FILE.search(line)
        if match:
            found.setdefault(match["set"] or match["failed"], None)
    return tuple(found)


def topology_file_read(said: Sequence[str]) -> bool:
    """Whether NCCL read its topology file, from `topology_file_lines`: it named one and did not fail to open
    it (an empty `NCCL_TOPO_FILE` names none: NCCL then reads the PCI tree it sees)."""
    named = any(line.startswith("NCCL_TOPO_FILE set by environment to ") for line in said)
    return named and not any(line.startswith("Could not open XML topology file ") for line in said)


def uses_p2p(records: Sequence[ChannelTransport]) -> bool:
    """Whether NCCL moves data GPU to GPU (P2P) between any two ranks."""
    return any(record.transport is Transport.P2P for record in records)


def summarize(records: Sequence[ChannelTransport]) -> tuple[PairTransport, ...]:
    """Records folded per (src_rank, dst_rank), sorted by ranks; a channel counts once per pair."""
    pairs: dict[tuple[int, int], list[ChannelTransport]] = {}
    for record in records:
        pairs.setdefault((record.src_rank, record.dst_rank), []).append(record)
    return tuple(
        PairTransport(
            src_rank=src,
            dst_rank=dst,
            transports=tuple(sorted({r.transport for r in group})),
            details=tuple(sorted({r.detail for r in group})),
            channels=len({r.channel for r in group}),
        )
        for (src, dst), group in sorted(pairs.items())
    )


def check_transports(
    profile: Literal["vm", "lxc", "baremetal"],
    records: Sequence[ChannelTransport],
    *,
    single_node: bool = True,
) -> tuple[str, ...]:
    """Warnings where the transports contradict `profile` (`vm`, `lxc`, `baremetal`); () when they agree.

    `vm` expects SHM: P2P there means P2P was forced (it hangs or corrupts data). `lxc`/`baremetal`
    expect P2P: SHM means NCCL_P2P_LEVEL, ACS or the IOMMU kept P2P off. With `single_node`, NET between
    ranks means SHM was disabled. No records at all is a warning too: the log says nothing.
    """
    if not records:
        return ("no NCCL channel lines found: set NCCL_DEBUG=INFO and restart the service to see transports",)
    expected = Transport.SHM if profile == "vm" else Transport.P2P
    warnings = []
    for pair in summarize(records):
        unexpected = [
            t for t in pair.transports if t != expected and not (t is Transport.NET and not single_node)
        ]
        if not unexpected:
            continue
        why = _WHY[(profile == "vm", unexpected[0])]
        warnings.append(f"{pair.describe()}; the {profile} profile expects {expected.value}: {why}")
    return tuple(warnings)


_WHY = {
    (
        True,
        Transport.P2P,
    ): "P2P is not supported between passed-through GPUs and forcing it hangs or corrupts data",
    (False, Transport.SHM): "P2P is off; check NCCL_P2P_LEVEL, `nvidia-smi topo -p2p r`, ACS and iommu=pt",
    (True, Transport.NET): "GPUs of one node talk over the network: is NCCL_SHM_DISABLE set?",
    (False, Transport.NET): "GPUs of one node talk over the network: P2P and SHM are both off",
}
