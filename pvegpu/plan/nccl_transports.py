"""What NCCL's transports say against the profile: `check_transports` warns where they contradict it
(`vm`: SHM only, P2P is not supported; `lxc` and `baremetal`: P2P)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pvegpu.models.nccl import ChannelTransport, Transport, summarize


def uses_p2p(records: Sequence[ChannelTransport]) -> bool:
    """Whether NCCL moves data GPU to GPU (P2P) between any two ranks."""
    return any(record.transport is Transport.P2P for record in records)


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
