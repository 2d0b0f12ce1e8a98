"""`vfio_config`: the modules-load.d and modprobe.d drop-ins that hand the selected GPUs to vfio-pci at boot.

pvegpu owns both files whole, written atomically. The initramfs carries modprobe configuration for early
boot, so `update-initramfs -u -k all` runs after either file changed (written or removed), and whenever an
initramfs image is older than that configuration (a run cut before the rebuild is finished by the next). The
`lxc` and `baremetal` profiles want both files absent (`present=False`): that also lifts the nvidia
blacklist the modprobe drop-in carries.
"""

from __future__ import annotations

from collections.abc import Generator

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts.pvegpu_boot import MODPROBE, MODULES_LOAD, BootFiles
from pvegpu.operations.files import regenerate, write_file
from pvegpu.operations.render import render
from pvegpu.plan.vfio import VfioPlan

MODULES_TEMPLATE = "pve_host/modules-load-pvegpu-vfio.conf.j2"
MODPROBE_TEMPLATE = "pve_host/modprobe-pvegpu-vfio.conf.j2"
UPDATE_INITRAMFS = regenerate("update-initramfs -u -k all", "/boot/initrd.img-*")


def render_vfio(plan: VfioPlan) -> dict[str, str]:
    """Path -> content of both drop-ins for `plan`."""
    return {
        MODULES_LOAD: render(MODULES_TEMPLATE, modules=plan.modules),
        MODPROBE: render(
            MODPROBE_TEMPLATE,
            ids=plan.ids,
            addresses=plan.addresses,
            softdeps=plan.softdeps,
            blacklist=plan.blacklist,
        ),
    }


@operation()
def vfio_config(
    files: BootFiles, plan: VfioPlan | None = None, present: bool = True
) -> Generator[StringCommand, None, None]:
    """Write the drop-ins that differ from `plan`, then refresh every initramfs; noop when both match and no
    initramfs image is older than them. `present=False`: remove those that exist (no `plan`), then refresh;
    noop when neither exists and no image is older than /etc/modprobe.d.

    `files` is the host's `PvegpuBootFiles` fact (read once by the role).
    """
    current = {MODULES_LOAD: files.modules_load, MODPROBE: files.modprobe}
    if not present:
        existing = [path for path, content in current.items() if content is not None]
        if not existing and not files.stale_initramfs:
            host.noop(f"{MODULES_LOAD} and {MODPROBE} are absent: nothing binds GPUs to vfio-pci at boot")
            return
        if existing:
            yield StringCommand("rm", "-f", *(QuoteString(path) for path in existing))
        else:
            _log_stale(files.stale_initramfs)
        yield UPDATE_INITRAMFS
        return
    if plan is None:
        raise ValueError("vfio_config: present=True needs a plan")
    changed = False
    for path, content in render_vfio(plan).items():
        if current[path] != content:
            yield write_file(path, content)
            changed = True
    if not changed and files.stale_initramfs:
        _log_stale(files.stale_initramfs)
    elif not changed:
        bound = f"ids {','.join(plan.ids)}" if plan.ids else f"addresses {' '.join(plan.addresses)}"
        host.noop(f"{MODULES_LOAD} and {MODPROBE} already bind {bound} to vfio-pci")
        return
    yield UPDATE_INITRAMFS


def _log_stale(images: tuple[str, ...]) -> None:
    logger.info(f"{host.print_prefix}{', '.join(images)} older than the modprobe configuration: rebuilding")
