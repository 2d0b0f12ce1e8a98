"""What NCCL's transports say against the NCCL plan in force: `check_transports` warns where they contradict
it (`vm`: SHM, P2P is not supported, unless P2P is proven; `lxc` and `baremetal`: P2P)."""

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
    p2p: bool | None = None,
) -> tuple[str, ...]:
    """Warnings where the transports contradict the plan of `profile` (`vm`, `lxc`, `baremetal`); () when
    they agree.

    `p2p`: whether the plan uses P2P (pvegpu.run.serving; default: not on `vm`, yes elsewhere). Without P2P
    (`vm`) SHM is expected: P2P there means P2P was forced (it hangs or corrupts data). With P2P, SHM means
    NCCL_P2P_LEVEL, ACS or the IOMMU kept P2P off (on a VM whose P2P was proven: the clique or the driver).
    With `single_node`, NET between ranks means SHM was disabled. No records at all is a warning too: the log
    says nothing.
    """
    if not records:
        return ("no NCCL channel lines found: set NCCL_DEBUG=INFO and restart the service to see transports",)
    with_p2p = profile != "vm" if p2p is None else p2p
    expected = Transport.P2P if with_p2p else Transport.SHM
    if with_p2p == (profile != "vm"):
        plan = f"the {profile} profile"
    else:
        plan = f"the {profile} profile " + ("with P2P proven" if with_p2p else "without P2P")
    warnings = []
    for pair in summarize(records):
        unexpected = [
            t for t in pair.transports if t != expected and not (t is Transport.NET and not single_node)
        ]
        if not unexpected:
            continue
        why = _WHY[(profile == "vm", with_p2p, unexpected[0])]
        warnings.append(f"{pair.describe()}; {plan} expects {expected.value}: {why}")
    return tuple(warnings)


_OFF = "P2P is off; check NCCL_P2P_LEVEL, `nvidia-smi topo -p2p r`, ACS and iommu=pt"
# (a VM, the plan uses P2P, the transport found) -> why it contradicts the plan.
_WHY = {
    (True, False, Transport.P2P): (
        "P2P is not supported between passed-through GPUs and forcing it hangs or corrupts data"
    ),
    (True, True, Transport.SHM): (
        "the VM's P2P was proven but NCCL did not use it; check NCCL_P2P_DISABLE and the GPUDirect clique "
        "in the VM's args"
    ),
    (False, True, Transport.SHM): _OFF,
    (False, False, Transport.P2P): "the plan keeps P2P off but NCCL used it: is NCCL_P2P_DISABLE=1 set?",
    (True, False, Transport.NET): "GPUs of one node talk over the network: is NCCL_SHM_DISABLE set?",
    (True, True, Transport.NET): "GPUs of one node talk over the network: P2P and SHM are both off",
    (False, True, Transport.NET): "GPUs of one node talk over the network: P2P and SHM are both off",
    (False, False, Transport.NET): "GPUs of one node talk over the network: is NCCL_SHM_DISABLE set?",
}
