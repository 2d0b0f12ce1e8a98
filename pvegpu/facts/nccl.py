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

The records' types are pvegpu/models/nccl.py's; what they mean for the profile,
pvegpu/plan/nccl_transports.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pvegpu.facts.errors import FactParseError
from pvegpu.models.nccl import ChannelTransport, Transport

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
