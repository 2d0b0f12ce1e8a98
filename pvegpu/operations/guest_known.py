"""A cloud-image VM's guest, known before anyone logs in: its address and the host key pvegpu gave it are
in the known_hosts file the inventory uses (`pvegpu.guest_keys`), so pyinfra's first contact is strict.

- a static address (`vm.ipconfig ip=A/N`): the known_hosts line is written from the inventory alone;
- DHCP: the address is what the QEMU guest agent reports for the VM's `net0` MAC, read through the API
  (waited for: the agent starts with the guest), then recorded beside the key (`guests_of` reads it) and
  the known_hosts line written; then the guest's sshd must answer with the expected key.

Only this machine's files are written (the operator's known_hosts and the address file), while pyinfra
executes, so `--dry` shows the change and writes nothing.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.guest_keys import known_host_recorded, record_address, record_known_host, recorded_address
from pvegpu.host_key_probe import HostKeyMismatchError, wait_for_host_key
from pvegpu.operations.api_command import api_command, one_line_errors
from pvegpu.pve import PveClient, PveError
from pvegpu.wait import WaitTimeoutError, wait_until


@dataclass(frozen=True)
class GuestIdentity:
    """Who the guest is to the operator's machine: its name, the known_hosts file, its key files and its
    address (None: DHCP, learnt from the guest agent)."""

    name: str
    known_hosts: Path
    private_key: Path
    public_key: str
    address: str | None


def wait_until_answering(identity: GuestIdentity, address: str, timeout_s: float) -> None:
    """Wait until the guest's sshd at `address` answers with its key; OperationError otherwise."""
    try:
        wait_for_host_key(
            address, identity.public_key, timeout_s, f"guest {identity.name}: sshd at {address} not answering"
        )
    except HostKeyMismatchError as error:
        raise OperationError(f"guest {identity.name}: {error}") from None
    except WaitTimeoutError as timeout:
        raise OperationError(f"{timeout} (last: {timeout.last})") from None


@operation()
@one_line_errors
def guest_known(
    *, identity: GuestIdentity, api: PveClient, node: str, vmid: int, mac: str | None, timeout_s: float
) -> Generator[FunctionCommand]:
    """The guest's address and host key are in `identity.known_hosts` (module docstring)."""
    address = identity.address or recorded_address(identity.private_key)
    if address is not None and known_host_recorded(identity.known_hosts, address, identity.public_key):
        host.noop(f"guest {identity.name}: {address} and its host key are in {identity.known_hosts}")
        return
    if address is not None:
        logger.info(
            f"{host.print_prefix}guest {identity.name}: record {address}'s host key in {identity.known_hosts}"
        )
        yield api_command(record_known_host, identity.known_hosts, address, identity.public_key)
        return
    logger.info(f"{host.print_prefix}guest {identity.name}: learn its address from VM {vmid}'s guest agent")
    yield api_command(_learn_address, identity, api, _Vm(node, vmid, mac), timeout_s)


@dataclass(frozen=True)
class _Vm:
    node: str
    vmid: int
    mac: str | None


def _learn_address(identity: GuestIdentity, api: PveClient, vm: _Vm, timeout_s: float) -> None:
    found: list[str] = []

    def pending() -> str | None:
        try:
            interfaces = api.guest_addresses(vm.node, vm.vmid)
        except PveError as error:
            return error.line
        for interface in interfaces:
            if (
                interface.ipv4
                and interface.name != "lo"
                and (vm.mac is None or interface.mac.lower() == vm.mac.lower())
            ):
                found.append(interface.ipv4[0].split("/")[0])
                return None
        return f"no IPv4 address on {vm.mac or 'a network interface'} yet"

    try:
        wait_until(
            pending,
            timeout_s,
            f"guest {identity.name}: VM {vm.vmid}'s guest agent reports no address",
            interval_s=2.0,
        )
    except WaitTimeoutError as timeout:
        raise OperationError(f"{timeout} (last: {timeout.last})") from None
    address = found[0]
    wait_until_answering(identity, address, timeout_s)
    record_known_host(identity.known_hosts, address, identity.public_key)
    record_address(identity.private_key, address)
    logger.info(f"{host.print_prefix}guest {identity.name}: {address}, host key recorded")
