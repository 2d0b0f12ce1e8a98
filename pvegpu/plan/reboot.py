"""Is a reboot pending? Compare the running kernel with the boot state pvegpu wrote. Pure.

Pending: a desired token missing from the running command line, and with vfio wanted (`vm`): no IOMMU
groups, or a selected GPU function not bound to vfio-pci; without (`lxc`, `baremetal`): a selected GPU
function still bound to vfio-pci. Each reason is one clause of the message operators read:
`reboot required: /proc/cmdline lacks iommu=pt; 0000:41:00.0 still bound to nvidia`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pvegpu.models.hardware import HostHardware

VFIO_DRIVER = "vfio-pci"


def pending_reasons(
    running: Sequence[str],
    desired: Sequence[str],
    hw: HostHardware,
    functions: Sequence[str],
    retired: Sequence[str] = (),
    *,
    vfio: bool = True,
) -> tuple[str, ...]:
    """Every difference between the running state and the wanted one, in a stable order; () when none.

    `retired`: tokens pvegpu owned and no longer wants (removed from the next boot's command line).
    `vfio`: the `functions` must be bound to vfio-pci (True) or to anything else (False).
    """
    if not vfio:
        return _host_driver_reasons(running, desired, hw, functions, retired)
    reasons = _token_reasons(running, desired, retired)
    if not hw.iommu_present:
        reasons.append("the IOMMU is off (no IOMMU groups)")
    # Functions in the same state share one clause: "0000:41:00.0, 0000:51:00.0 still bound to nvidia".
    clauses: dict[str, list[str]] = {}
    for address in functions:
        function = hw.by_address.get(address)
        if function is None:
            clauses.setdefault("missing", []).append(address)
        elif function.driver is None:
            clauses.setdefault("bound to no driver", []).append(address)
        elif function.driver != VFIO_DRIVER:
            clauses.setdefault(f"still bound to {function.driver}", []).append(address)
    reasons.extend(f"{', '.join(addresses)} {state}" for state, addresses in clauses.items())
    return tuple(reasons)


def _host_driver_reasons(
    running: Sequence[str],
    desired: Sequence[str],
    hw: HostHardware,
    functions: Sequence[str],
    retired: Sequence[str],
) -> tuple[str, ...]:
    reasons = list(_token_reasons(running, desired, retired))
    held = [
        address
        for address in functions
        if (function := hw.by_address.get(address)) is not None and function.driver == VFIO_DRIVER
    ]
    if held:
        reasons.append(f"{', '.join(held)} still bound to {VFIO_DRIVER}")
    return tuple(reasons)


def _token_reasons(running: Sequence[str], desired: Sequence[str], retired: Sequence[str]) -> list[str]:
    reasons = []
    missing = [token for token in desired if token not in running]
    if missing:
        reasons.append(f"/proc/cmdline lacks {' '.join(missing)}")
    stale = [token for token in retired if token in running and token not in desired]
    if stale:
        reasons.append(f"/proc/cmdline still has {' '.join(stale)}")
    return reasons


def pending_message(reasons: Sequence[str]) -> str:
    return "reboot required: " + "; ".join(reasons)
