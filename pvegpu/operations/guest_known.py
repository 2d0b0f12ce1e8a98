"""A cloud-image VM's guest, known before anyone logs in: its address and the host key pvegpu gave it are
in the known_hosts file the inventory uses (`pvegpu.local.guest_keys`), so pyinfra's first contact is strict.

- a static address (`vm.ipconfig ip=A/N`): the known_hosts line is written from the inventory alone;
- DHCP: the address is what the QEMU guest agent reports for the VM's `net0` MAC, read through the API
  (waited for: the agent starts with the guest; an address pvegpu will not connect to is refused,
  pvegpu.plan.guest_address), then recorded beside the key (`guests_of` reads it) and
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

from pvegpu.local.files import LocalWriteError
from pvegpu.local.guest_keys import known_host_recorded, record_address, record_known_host, recorded_address
from pvegpu.local.host_key_probe import HostKeyMismatchError, wait_for_host_key
from pvegpu.operations.api_command import api_command, one_line_errors
from pvegpu.operations.pve_guest import Guest
from pvegpu.plan.convert import net0_mac
from pvegpu.plan.guest_address import GuestAddressError, net0_address
from pvegpu.pve.errors import PveError
from pvegpu.run.wait import WaitTimeoutError, wait_until


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
    *, identity: GuestIdentity, guest: Guest, mac: str | None, timeout_s: float
) -> Generator[FunctionCommand]:
    """The address and host key of VM `guest`'s guest are in `identity.known_hosts` (module docstring);
    `mac`: net0's, None to read it from the VM's config."""
    address = identity.address or recorded_address(identity.private_key)
    if address is not None and known_host_recorded(identity.known_hosts, address, identity.public_key):
        host.noop(f"guest {identity.name}: {address} and its host key are in {identity.known_hosts}")
        return
    if address is not None:
        logger.info(
            f"{host.print_prefix}guest {identity.name}: record {address}'s host key in {identity.known_hosts}"
        )
        yield api_command(_record, identity, address, False)
        return
    logger.info(
        f"{host.print_prefix}guest {identity.name}: learn its address from VM {guest.vmid}'s guest agent"
    )
    yield api_command(_learn_address, identity, guest, mac, timeout_s)


def _record(identity: GuestIdentity, address: str, learnt: bool) -> None:
    """`address` and the guest's host key into known_hosts (and, `learnt` from the agent, the address beside
    the key); a file not written fails the host in one line naming it, the old file kept."""
    try:
        record_known_host(identity.known_hosts, address, identity.public_key)
        if learnt:
            record_address(identity.private_key, address)
    except LocalWriteError as error:
        raise OperationError(f"guest {identity.name}: {error}") from None


def _net0_mac(identity: GuestIdentity, guest: Guest) -> str:
    """net0's MAC in the VM's config: the only NIC whose address pvegpu takes from the guest agent."""
    try:
        mac = net0_mac(guest.api.vm_config(guest.node, guest.vmid).values)
    except PveError as error:
        raise OperationError(f"guest {identity.name}: VM {guest.vmid}: {error.line}") from None
    if mac is None:
        raise OperationError(
            f"guest {identity.name}: VM {guest.vmid} has no net0 MAC, the NIC whose address pvegpu takes "
            "from the guest agent"
        )
    return mac


def _learn_address(identity: GuestIdentity, guest: Guest, net0: str | None, timeout_s: float) -> None:
    mac = net0 or _net0_mac(identity, guest)
    found: list[str] = []

    def pending() -> str | None:
        try:
            interfaces = guest.api.guest_addresses(guest.node, guest.vmid)
        except PveError as error:
            return error.line
        try:
            address = net0_address(interfaces, mac, guest.vmid)
        except GuestAddressError as refused:
            raise OperationError(f"guest {identity.name}: {refused}") from None
        if address is None:
            return f"no IPv4 address on net0 ({mac}) yet"
        found.append(address)
        return None

    try:
        wait_until(
            pending,
            timeout_s,
            f"guest {identity.name}: VM {guest.vmid}'s guest agent reports no address",
            interval_s=2.0,
        )
    except WaitTimeoutError as timeout:
        raise OperationError(f"{timeout} (last: {timeout.last})") from None
    address = found[0]
    wait_until_answering(identity, address, timeout_s)
    _record(identity, address, True)
    logger.info(f"{host.print_prefix}guest {identity.name}: {address}, host key recorded")
