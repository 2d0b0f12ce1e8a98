"""nvidia_driver: NVIDIA's open driver from the CUDA apt repository, pinned, where the profile serves from.

- `guest` (a VM's guest; a bare-metal host that is not Proxmox): the driver with its kernel module (dkms),
  nouveau off, persistence on, reboot only when the loaded module is not the pinned one and
  `driver.allow_reboot`; then verify.
- `pve-host` (a Proxmox node on profile `lxc` or `baremetal`): the same, built for the Proxmox kernel
  (Proxmox's headers), plus the NVIDIA modules loaded at boot and `pvegpu-nvidia-devices.service`, which
  creates every device node a container binds (`nvidia-uvm` too) before Proxmox starts its guests. Its
  reboot passes the node's reboot guards (no foreign guest stopped, no kernel without the module), as
  pve_host's does.
- `container` (the `lxc` profile's container, group `lxc_guests`): userspace only, at the pinned version,
  no module package ever (apt preferences); the module is the host's, so a different loaded version fails
  with both versions, and nothing reboots.

Packages per placement and why: pvegpu/plan/driver.py. Bad data the models cannot see alone (the
proprietary flavour for Blackwell ids, a distribution NVIDIA has no repository for) fails while
operations are collected, before any host is changed.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.context import host
from pyinfra.operations import server, systemd
from pyinfra.operations.util import any_changed

from pvegpu.operations.from_state import file_content, packages, service
from pvegpu.operations.nvidia import (
    cuda_repository,
    device_nodes_present,
    driver_module,
    driver_verified,
    refuse_driver_reboot,
)
from pvegpu.operations.render import render
from pvegpu.operations.vfio import UPDATE_INITRAMFS
from pvegpu.plan.driver import (
    DEVICES_SERVICE,
    DEVICES_UNIT,
    KERNEL_PACKAGES,
    MODULES_LOAD,
    NOUVEAU_DROP_IN,
    PERSISTENCED,
    PREFERENCES,
    UVM_OPTIONS,
    DriverPlan,
    Placement,
)
from pvegpu.run.driver import driver_plan_of
from pvegpu.run.host_state import state_of
from pvegpu.run.plan import plan_failures
from pvegpu.run.units import reload_if


@deploy("Install the NVIDIA driver")
def nvidia_driver(placement: Placement = "guest") -> None:
    """CUDA repository, pinned packages for `placement`, then what the placement needs (module docstring)."""
    with plan_failures(host):
        plan = driver_plan_of(host, placement)
    driver, container = plan.driver, plan.container
    if plan.guard is not None:  # refused while operations are collected: nothing of this run is written yet
        refuse_driver_reboot(host, driver, plan.guard)
    _pinned_repository(plan)
    what = "userspace (no kernel module)" if container else "driver with its kernel module (dkms)"
    installing = packages(
        name=f"Install the {driver.flavour} NVIDIA {what} {driver.version}",
        packages=plan.packages,
        no_recommends=container,
        allow_downgrades=True,  # the pin follows driver.version both ways; a container follows its host's
    ).will_change
    unit = None if container else _module_side(plan)
    driver_module(
        name="Check the host's kernel module is the pinned one"
        if container
        else "Load the pinned kernel module (reboot when allowed)",
        driver=driver,
        installing=installing,
        container=container,
        guard=plan.guard,
    )
    if unit is not None:
        _device_nodes(plan.device_nodes, unit, installing)
    driver_verified(
        name="Verify the GPUs, module flavour and version",
        driver=driver,
        gpu_count=plan.gpu_count,
        installing=installing,
    )


def _pinned_repository(plan: DriverPlan) -> None:
    """NVIDIA's CUDA apt repository, and apt preferences that pin its driver packages to `driver.version`
    (in a container: every kernel module package forbidden)."""
    driver, container = plan.driver, plan.container
    cuda_repository(
        name="Add NVIDIA's CUDA apt repository",
        source_line=plan.source_line,
        list_path=plan.list_path,
        keyring_url=plan.keyring_url,
    )
    preferences = render(
        "nvidia_driver/apt-preferences-pvegpu-nvidia.j2",
        version=driver.version,
        container=container,
        kernel_packages=KERNEL_PACKAGES,
    )
    file_content(
        name=f"Pin NVIDIA's driver packages to {driver.version}"
        + (", no kernel module" if container else ""),
        content=preferences,
        path=PREFERENCES,
        mode="644",
    )


def _module_side(plan: DriverPlan) -> OperationMeta | None:
    """nouveau off and, with `hmm_off`, nvidia_uvm without HMM (the initramfs refreshed when either file
    changes or an image is older than the blacklist: a run cut before the refresh is finished by the next;
    the uvm file goes first, so the refresh also covers /etc/modprobe.d's new mtime, which the vfio parking
    of pvegpu/operations/vfio.py compares the images with), persistence on; on a Proxmox host the modules and
    the device unit for boot (returned: its write, which decides a reload and a rerun); `plan.hmm_off`:
    nvidia_uvm without HMM."""
    stale = state_of(host).stale_initramfs
    if stale:
        logger.info(f"{host.print_prefix}initramfs older than {NOUVEAU_DROP_IN}: {', '.join(stale)}")
    drop_ins = [("Blacklist nouveau", "modprobe-pvegpu-nouveau.conf.j2", NOUVEAU_DROP_IN)]
    if plan.hmm_off:
        uvm = (
            "Turn off nvidia_uvm's HMM (P2P on the host hangs with it)",
            "modprobe-pvegpu-nvidia-uvm.conf.j2",
        )
        drop_ins.insert(0, (*uvm, UVM_OPTIONS))
    written = [
        file_content(name=name, content=render(f"nvidia_driver/{template}"), path=path, mode="644")
        for name, template, path in drop_ins
    ]
    server.shell(
        name="Refresh the initramfs without nouveau",
        commands=[UPDATE_INITRAMFS.get_raw_value()],
        _if=[] if stale else any_changed(*written),
    )
    service(name="Enable and start nvidia-persistenced", service=PERSISTENCED, running=True, enabled=True)
    if plan.placement != "pve-host":
        return None
    file_content(
        name="Load the NVIDIA modules at boot",
        content=render("nvidia_driver/modules-load-pvegpu-nvidia.conf.j2"),
        path=MODULES_LOAD,
        mode="644",
    )
    return file_content(
        name=f"Write {DEVICES_SERVICE} (device nodes before guests start)",
        content=render("nvidia_driver/pvegpu-nvidia-devices.service.j2", gpus=plan.gpus),
        path=DEVICES_UNIT,
        mode="644",
    )


def _device_nodes(nodes: tuple[str, ...], unit: OperationMeta, installing: bool) -> None:
    """The device unit enabled and run once the module is loaded (reloaded and rerun when it changed, in this
    run or in one that stopped before: `reload_if`), then every node checked."""
    reload = reload_if(host, DEVICES_SERVICE, unit)
    systemd.daemon_reload(name="Reload systemd units", _if=reload)
    service(name=f"Enable and run {DEVICES_SERVICE}", service=DEVICES_SERVICE, running=True, enabled=True)
    rerun = f"Rerun {DEVICES_SERVICE} after its change"
    service(name=rerun, service=DEVICES_SERVICE, restarted=True, _if=reload)
    device_nodes_present(
        name="Check the NVIDIA device nodes containers bind",
        nodes=nodes,
        installing=installing,
    )
