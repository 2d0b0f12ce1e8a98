"""NCCL's transports between ranks as its `NCCL_DEBUG=INFO` channel lines show them
(pvegpu/facts/nccl.py reads them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


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


# NCCL fills the variables its environment leaves unset from these files, NCCL_CONF_FILE (else the user's
# `~/.nccl.conf`) first, then `/etc/nccl.conf` (src/misc/param.cc `initEnvFunc`, `setenv(name, value, 0)`).
SYSTEM_CONF = "/etc/nccl.conf"
USER_CONF_NAME = ".nccl.conf"


@dataclass(frozen=True)
class ConfSetting:
    """One `NAME=value` line of an NCCL conf file as NCCL reads it; `line` is its 1-based number."""

    line: int
    name: str
    value: str
