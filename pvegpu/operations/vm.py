"""The Q35 VM through the Proxmox API: `q35_vm` (create or converge the config) and `guest_gpus` (the
guest sees the GPUs it should). Starting and parking it are pvegpu/operations/pve_guest.py's, with `VM`.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.create_records import CreateLedger
from pvegpu.models.hardware import HostHardware
from pvegpu.operations.pve_guest import VM, Guest, converge
from pvegpu.plan.hostpci import HostPciError
from pvegpu.plan.vm import VmChange, diff_vm, nvidia_gpus
from pvegpu.pve import PveClient


@operation()
def q35_vm(
    *,
    api: PveClient,
    node: str,
    vmid: int,
    config: Mapping[str, str],
    create: Mapping[str, str],
    prefix: str,
    timeout_s: float,
    ledger: CreateLedger | None = None,
    keep_clique: bool = False,
) -> Generator[FunctionCommand, None, None]:
    """Create VM `vmid` on `node` with `config` + `create` (plan/vm.py) when absent, else PUT the keys that
    differ (with the read's digest). Raises OperationError for a hostpci slot pvegpu must not take.
    `ledger`: pvegpu's records of its creates (`converge`). `keep_clique`: pvegpu's GPUDirect clique parts
    of `args` are left as they are (`vm.p2p: probe`: the P2P operation owns them)."""

    def diff(current: Mapping[str, object]) -> VmChange:
        try:
            return diff_vm(config, create, current, prefix, keep_clique=keep_clique)
        except HostPciError as error:
            raise OperationError(f"VM {vmid}: {error}") from None

    count = sum(1 for key in config if key.startswith("hostpci"))
    yield from converge(
        Guest(VM, api, node, vmid),
        create={**config, **create},
        diff=diff,
        unchanged=(
            f"VM {vmid} ({config['name']}) on {node} has its config: {config['machine']}, ovmf, "
            f"{count} hostpci devices"
        ),
        timeout_s=timeout_s,
        ledger=ledger,
    )


@operation()
def guest_gpus(hardware: HostHardware, expected: int) -> Generator[FunctionCommand, None, None]:
    """Check (read-only) that the guest's PCI bus shows `expected` NVIDIA GPUs; else fail naming them."""
    found = nvidia_gpus(hardware)
    if len(found) != expected:
        raise OperationError(
            f"the guest sees {len(found)} NVIDIA GPUs, expected {expected}: {', '.join(found) or 'none'}"
        )
    host.noop(f"the guest sees {expected} NVIDIA GPUs: {', '.join(found)}")
    yield from ()
