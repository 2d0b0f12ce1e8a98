"""NVIDIA driver operations: the CUDA apt repository, the loaded kernel module (reboot), verification.

They decide from the host's one state read (`pvegpu.run.host_state.state_of`: the keyring, the list file's
sha256, the loaded module, nvidia-smi); packages, files and units are `pvegpu.operations.from_state`'s.

The driver's own reboot on a Proxmox node (placement `pve-host`) passes the guards of every node reboot
(pvegpu/operations/reboot.py `refuse_node_reboot`: no foreign guest stopped, no kernel without the module):
`refuse_driver_reboot` while the role collects its operations when the reboot is certain, and
`driver_module` again right before it reboots. A VM guest's reboot stops nothing of the node: only the
kernel guard, on the guest's own kernels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Generator, Sequence

from pyinfra.api.command import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts.nvidia import (
    CharDevices,
    char_devices_command,
    nvidia_smi_command,
    parse_nvidia_smi,
    parse_version_file,
    version_file_command,
)
from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.operations.api_command import api_command
from pvegpu.operations.files import write_file
from pvegpu.operations.reboot import (
    REBOOT,
    refuse_kernel_without_module,
    refuse_node_reboot,
    wait_after_reboot,
)
from pvegpu.plan.driver import (
    DEVICES_SERVICE,
    KEYRING,
    container_module_problem,
    module_mismatch,
    verify_problems,
)
from pvegpu.plan.reboot import RebootGuard
from pvegpu.run.host_state import state_of

KEYRING_DOWNLOAD = "/tmp/pvegpu-cuda-keyring.deb"


@operation()
def cuda_repository(
    *, source_line: str, list_path: str, keyring_url: str
) -> Generator[StringCommand, None, None]:
    """NVIDIA's cuda-keyring installed (fetched from `keyring_url` with apt's own downloader, which speaks
    https and file:) and `list_path` holding exactly `source_line`; `apt-get update` after either changed.

    The keyring package ships its own list file at `list_path` pointing at NVIDIA's servers; pvegpu owns that
    file (`--force-confold` keeps pvegpu's), so a mirror or a lab repository is the only source.
    """
    observed = state_of(host)
    changed = False
    if observed.path(KEYRING).kind != "file":
        download = QuoteString(KEYRING_DOWNLOAD)
        yield StringCommand(
            "/usr/lib/apt/apt-helper", "download-file", QuoteString(keyring_url), download,
            "&&", "dpkg", "--force-confold", "-i", download, "&&", "rm", "-f", download,
        )  # fmt: skip
        changed = True
    if observed.path(list_path).sha256 != hashlib.sha256(source_line.encode()).hexdigest():
        yield write_file(list_path, source_line)
        changed = True
    if not changed:
        host.noop(f"{list_path} already points apt at {source_line.split()[-2]} (key {KEYRING})")
        return
    yield StringCommand("apt-get", "update", "-qq")


def _read_module(target: Host, version_file: str) -> str:
    ok, output = target.run_shell_command(version_file_command(version_file), print_output=False)
    return "\n".join(output.stdout_lines) if ok else ""


def refuse_driver_reboot(target: Host, driver: DriverSpec, guard: RebootGuard) -> None:
    """While the role collects its operations on a Proxmox node: when `driver.allow_reboot` and the loaded
    module is another one than the pinned (only a reboot replaces it), `refuse_node_reboot` with `guard`,
    before any host is changed. Nothing loaded (a first install: the new module may just load) or the
    pinned one loaded: nothing read, `driver_module` decides at execution."""
    loaded = state_of(target).module
    if driver.allow_reboot and loaded is not None and module_mismatch(driver, loaded) is not None:
        refuse_node_reboot(target, guard)


@operation()
def driver_module(
    *, driver: DriverSpec, installing: bool, container: bool = False, guard: RebootGuard | None = None
) -> Generator[StringCommand | FunctionCommand, None, None]:
    """The pinned module loaded: noop when it is (and nothing is being installed); otherwise, after the
    packages are installed, load it when no module is loaded, check again and reboot when allowed (then
    wait and check), or fail saying why. With `guard` (a Proxmox node), the reboot first passes
    `refuse_node_reboot` (it fails the host in one line instead).

    `container`: the module is the host's; never reboot, fail naming both versions when it differs."""
    loaded = state_of(host).module
    if container:
        problem = container_module_problem(driver, loaded)
        if problem is not None:
            raise OperationError(problem)
        host.noop(f"the host's {driver.flavour} NVIDIA kernel module {driver.version} is loaded")
        return
    if not installing and module_mismatch(driver, loaded) is None:
        host.noop(f"the {driver.flavour} NVIDIA kernel module {driver.version} is loaded")
        return
    if loaded is None:
        # Nothing is loaded: the module dkms just built loads without a reboot (an older one would not).
        yield StringCommand("modprobe", "nvidia", "2>/dev/null", "||", "true")

    def mismatch(target: Host) -> str | None:
        return module_mismatch(
            driver, parse_version_file(_read_module(target, driver.version_file).splitlines())
        )

    if driver.allow_reboot:
        yield from _reboot_when(mismatch, driver, guard)
        return

    def check() -> None:
        reason = mismatch(host)
        if reason is not None:
            raise OperationError(f"{reason}: reboot the host, or set {DRIVER_KEY}.allow_reboot")

    yield api_command(check)


def _reboot_when(
    mismatch: Callable[[Host], str | None], driver: DriverSpec, guard: RebootGuard | None
) -> Generator[StringCommand | FunctionCommand, None, None]:
    """Reboot (only if `mismatch` still finds a reason at execution, and the guards let it), then wait until
    it finds none. A Proxmox node passes `guard` (`refuse_node_reboot`); a VM guest or a host that is no
    Proxmox node boots its own distribution's kernel, which must have the module too (its kernel upgrades
    as the node's do: `refuse_kernel_without_module`, Debian's headers and GRUB's default in the fix)."""

    def reboot_and_wait() -> None:
        if mismatch(host) is None:
            return
        if guard is not None:
            refuse_node_reboot(host, guard)
        else:
            refuse_kernel_without_module(host, driver.version, proxmox=False)
        host.run_shell_command(StringCommand(REBOOT), print_output=False)
        wait_after_reboot(host, mismatch, driver.reboot_timeout_s)

    yield api_command(reboot_and_wait)


@operation()
def driver_verified(
    *, driver: DriverSpec, gpu_count: int | None, installing: bool
) -> Generator[FunctionCommand, None, None]:
    """nvidia-smi lists `gpu_count` GPUs at the pinned version, and the loaded module is the pinned flavour
    and version. Checked from facts when nothing is being installed (noop, or fail with every problem);
    after an installation, checked on the host once the packages are in."""

    def problems(target: Host) -> tuple[str, ...]:
        module = parse_version_file(_read_module(target, driver.version_file).splitlines())
        _, output = target.run_shell_command(StringCommand(nvidia_smi_command()), print_output=False)
        return verify_problems(driver, module, parse_nvidia_smi(output.stdout_lines), gpu_count)

    if not installing:
        observed = state_of(host)
        found = verify_problems(driver, observed.module, observed.smi, gpu_count)
        if found:
            raise OperationError("; ".join(found))
        count = "" if gpu_count is None else f"{gpu_count} "
        host.noop(f"nvidia-smi lists {count}GPUs on the {driver.flavour} kernel module {driver.version}")
        return

    def verify() -> None:
        found = problems(host)
        if found:
            raise OperationError("; ".join(found))

    yield api_command(verify)


@operation()
def device_nodes_present(*, nodes: Sequence[str], installing: bool) -> Generator[FunctionCommand, None, None]:
    """Every path in `nodes` is a character device: from the fact when nothing is being installed (noop, or
    fail naming the missing ones); after an installation, checked on the host once the unit has run."""

    def missing(present: Collection[str]) -> str | None:
        absent = [path for path in nodes if path not in present]
        if not absent:
            return None
        return f"missing NVIDIA device nodes: {', '.join(absent)} ({DEVICES_SERVICE} creates them)"

    if not installing:
        present: frozenset[str] = host.get_fact(CharDevices, paths=tuple(nodes))
        problem = missing(present)
        if problem is not None:
            raise OperationError(problem)
        host.noop(f"{len(nodes)} NVIDIA device nodes exist ({nodes[0]} .. {nodes[-1]})")
        return

    def check() -> None:
        _, output = host.run_shell_command(StringCommand(char_devices_command(nodes)), print_output=False)
        problem = missing(output.stdout_lines)
        if problem is not None:
            raise OperationError(problem)

    yield api_command(check)
