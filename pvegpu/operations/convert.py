"""Converting an existing i440FX/SeaBIOS VM to Q35/OVMF (plan/convert.py decides; this reads and acts).

`q35_conversion` reads the VM's config and, for a VM that is not Q35/OVMF yet and runs, what its guest agent
shows (through the Proxmox API: `agent/get-fsinfo`, `agent/file-read` of /etc/os-release and the EFI
loaders, `agent/network-get-interfaces`). A refusal fails the host with the planner's text (the exact steps
to take), nothing changed. A conversion logs every step while preparing (so `--dry` shows the whole plan,
changing nothing), then yields one command per step: the NIC pin written in the guest and read back, the
conf copy on the node (checked against the digest the plan was made from), the clean shutdown, and the PUT
of the Q35/OVMF keys with that digest, read back. The start is the role's next operation.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Generator, Mapping

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.models.guest_boot import GuestBoot, GuestFilesystem
from pvegpu.operations.api_command import api_command, attempt, one_line_errors, what_came_back
from pvegpu.operations.pve_guest import (
    ConfigChange,
    Guest,
    Ownership,
    locked,
    mark_to_write,
    wait_status,
    with_mark,
)
from pvegpu.plan.convert import (
    OS_RELEASE,
    Conversion,
    GuestFile,
    Refusal,
    legacy_firmware,
    loader_paths,
    os_id,
    plan_conversion,
)
from pvegpu.plan.guest_leftovers import left_by_a_create
from pvegpu.plan.hostpci import HostPciError
from pvegpu.plan.vm import VmChange, VmPlan, diff_vm
from pvegpu.pve.errors import PveError


@operation()
@one_line_errors
def q35_conversion(
    *,
    guest: Guest,
    vm: VmPlan,
    timeout_s: float,
    ownership: Ownership | None = None,
) -> Generator[FunctionCommand | StringCommand, None, None]:
    """Convert VM `guest` to Q35/OVMF with the plan's `config`/`create` and mapping prefix (plan/vm.py
    `VmPlan`) when it is not, and its guest shows it can boot that way; else raise OperationError with the
    steps to take. Noop when the VM
    does not exist (q35_vm creates it) or is Q35/OVMF already. With `ownership`, a VM without pvegpu's mark
    is refused (one line naming `vm.adopt`) unless adopted; adopted, the conversion's PUT writes the mark."""
    current = guest.read_config(refuse_locked=False)
    if current is None:
        host.noop(f"VM {guest.vmid} does not exist on {guest.node}: nothing to convert")
        return
    if left_by_a_create(current.values):  # not an installed VM: q35_vm makes it again or reports it
        host.noop(f"VM {guest.vmid} on {guest.node} was never completely created: nothing to convert")
        return
    if ownership is not None:
        mark_to_write(guest, current.values, ownership)  # refused unless it is pvegpu's or adopted
    if "lock" in current.values:
        raise OperationError(locked(guest, str(current.values["lock"])))
    legacy = legacy_firmware(current.values)
    if not legacy:
        host.noop(f"VM {guest.vmid} on {guest.node} is Q35/OVMF: nothing to convert")
        return

    def q35_diff(values: Mapping[str, object]) -> ConfigChange:
        try:
            change: VmChange = diff_vm(vm.config, vm.create, values, vm.spec.mapping_prefix, converting=True)
        except HostPciError as error:
            raise OperationError(f"VM {guest.vmid}: {error}") from None
        return change

    diff = q35_diff if ownership is None else with_mark(q35_diff, ownership)

    change = diff(current.values)
    running = guest.read_status() == "running"
    boot = observe(guest) if running else GuestBoot()
    plan = plan_conversion(
        guest.vmid, guest.node, current, running=running, boot=boot, change=change.set, delete=change.delete
    )
    if isinstance(plan, Refusal):
        raise OperationError(plan.text)
    logger.info(f"{host.print_prefix}VM {guest.vmid}: convert to Q35/OVMF (now {', '.join(legacy)})")
    for number, step in enumerate(plan.steps, 1):
        logger.info(f"{host.print_prefix}VM {guest.vmid} step {number}: {step}")
    if plan.link is not None:
        yield api_command(_write_in_guest, guest, plan.link)
    yield StringCommand(backup_command(plan))
    yield api_command(_shut_down, guest, timeout_s)
    yield api_command(_set_q35, guest, plan, diff)


def observe(guest: Guest) -> GuestBoot:
    """What the running guest's agent shows (models/guest_boot.py); `agent_error` set when the agent does
    not answer the first call. A loader file-read that fails counts as the file missing."""
    try:
        filesystems = _filesystems(guest.api.agent_get(guest.node, guest.vmid, "get-fsinfo"))
        nics = guest.api.guest_addresses(guest.node, guest.vmid)
    except PveError as error:
        return GuestBoot(agent_error=error.line)
    release = guest.api.agent_file_read(guest.node, guest.vmid, OS_RELEASE)
    distribution = None if release is None else os_id(release)
    files = {
        path: bool(guest.api.agent_file_read(guest.node, guest.vmid, path))
        for path in loader_paths(distribution)
    }
    return GuestBoot(filesystems=filesystems, files=files, nics=nics, os_id=distribution)


def backup_command(plan: Conversion) -> str:
    """Copy the VM's conf file to `plan.backup` (directory 0700), kept only when its SHA-1 is the digest the
    plan was made from (Proxmox's config digest is the file's SHA-1): else the command fails, nothing kept."""
    backup, partial = shlex.quote(plan.backup), shlex.quote(f"{plan.backup}.partial")
    directory = shlex.quote(plan.backup.rsplit("/", 1)[0])
    check = shlex.quote(f"{plan.digest}  {plan.backup}.partial")
    return (
        f"install -d -m 0700 {directory} && cp {shlex.quote(plan.conf)} {partial} && "
        f"{{ echo {check} | sha1sum --check --quiet || {{ rm -f {partial}; exit 1; }}; }} && "
        f"mv {partial} {backup}"
    )


def _filesystems(answer: Mapping[str, object]) -> tuple[GuestFilesystem, ...]:
    result = answer.get("result")
    if not isinstance(result, list) or not all(isinstance(item, dict) for item in result):
        raise OperationError(
            f"agent/get-fsinfo: expected a list of filesystems under 'result', got {result!r}"
        )
    return tuple(
        GuestFilesystem(str(item.get("name", "")), str(item.get("mountpoint", "")), str(item.get("type", "")))
        for item in result
    )


def _write_in_guest(guest: Guest, file: GuestFile) -> None:
    content = {"file": file.path, "content": file.content}
    failure = attempt(lambda: guest.api.agent_post(guest.node, guest.vmid, "file-write", content))
    said = what_came_back(failure, f"POST /nodes/{guest.node}/qemu/{guest.vmid}/agent/file-write")
    if guest.api.agent_file_read(guest.node, guest.vmid, file.path) != file.content:
        raise OperationError(
            f"VM {guest.vmid}: {file.path} not written in the guest ({said}; reading it back shows other "
            "content): not converted, nothing else changed"
        )


def _shut_down(guest: Guest, timeout_s: float) -> None:
    try:
        guest.api.wait_task(guest.api.shutdown_vm(guest.node, guest.vmid, int(timeout_s)), timeout_s + 30)
    except PveError as error:
        raise OperationError(
            f"VM {guest.vmid} did not shut down ({error.line}): not converted, its config is unchanged"
        ) from None
    wait_status(guest, "stopped", timeout_s, "the shutdown task ended OK, but it runs")


def _set_q35(guest: Guest, plan: Conversion, diff: Callable[[Mapping[str, object]], ConfigChange]) -> None:
    """PUT the Q35/OVMF keys with the digest the plan was made from, then read back. A VM left unconverted is
    stopped: the message says to start it (a stopped VM's guest cannot be checked), then to run again."""
    restart = f"it is stopped: start it (`qm start {guest.vmid}`), then run again"
    before = guest.read_config()
    if before is None or before.digest != plan.digest:
        raise OperationError(
            f"VM {guest.vmid} not converted: its config changed since it was checked; {restart}"
        )
    failure = attempt(
        lambda: guest.api.update_vm_config(guest.node, guest.vmid, plan.set, plan.digest, plan.delete)
    )
    said = what_came_back(failure, f"PUT {guest.config_endpoint}")
    try:
        after = guest.config_or_none()
    except PveError as error:
        raise OperationError(f"VM {guest.vmid}: {said}; reading it back failed: {error.line}") from None
    if after is None or after.digest == plan.digest or legacy_firmware(after.values):
        raise OperationError(f"VM {guest.vmid} not converted ({said}); {restart}")
    if diff(after.values).changed:
        raise OperationError(f"VM {guest.vmid} is Q35/OVMF, but not every key was set ({said}); run again")
    if failure is not None:
        logger.warning(f"{host.print_prefix}VM {guest.vmid}: {failure.line}; reading it back shows Q35/OVMF")
