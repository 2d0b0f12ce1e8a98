"""lxc_gpu: the `lxc` profile's container on the host's NVIDIA driver, through the Proxmox API.

Created or converged with a `devN:` entry for every GPU (`/dev/nvidiaN`) and for nvidiactl, nvidia-uvm,
nvidia-uvm-tools, nvidia-modeset and the nvidia-caps nodes (Proxmox >= 8.1); before 8.1 the same devices
as raw `lxc.cgroup2` / `lxc.mount.entry` lines with majors from /proc/devices. A /dev/shm of
`lxc.shm_gib` for NCCL. Started. Every run: the container's userspace driver must equal the host's
kernel module (both versions reported when not). Plans: pvegpu/plan/lxc.py.

`lxc_gpu_parked` is the other profiles' side: the container stopped and `onboot: 0`, never deleted.

The host driver (kernel module, device nodes at boot) is roles/nvidia_driver.py's `pve-host` placement,
run before this; the container's userspace driver is its `container` placement (group `lxc_guests`).
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.facts.boot import PveVersion
from pvegpu.facts.hardware import hardware_of
from pvegpu.facts.lxc_devices import ContainerDriverVersion, NvidiaDeviceNodes
from pvegpu.facts.nvidia import NvidiaModule
from pvegpu.facts.pve import api_spec, pve_client
from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.inventory import spec_of
from pvegpu.models.lxc import LXC_KEY, LxcSpec
from pvegpu.operations.lxc import container_driver, lxc_container, lxc_parked, lxc_raw_lines, lxc_running
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import (
    SHM_ENTRY,
    SHM_PREFIX,
    container_config,
    create_keys,
    plan_lxc_devices,
    raw_lines,
)
from pvegpu.plan.topology import plan_topology
from roles.pci_mapping import node_of


@deploy("Create and start the GPU container")
def lxc_gpu() -> None:
    """Container config + devices, raw lines, started, driver versions compared."""
    node = node_of(host)
    if host.data.get(LXC_KEY) is None:
        raise OperationError(f"{host.name}: profile lxc needs `lxc` data (the container: vmid, ostemplate)")
    spec = spec_of(host.data, LXC_KEY, LxcSpec)
    release = host.get_fact(PveVersion)
    if release is None:
        raise OperationError(f"{host.name}: profile lxc needs Proxmox VE (no pveversion on this host)")
    gpus = plan_topology(hardware_of(host, node.sysfs_root), node.gpus).gpus
    nodes = host.get_fact(NvidiaDeviceNodes)
    version_file = spec_of(host.data, DRIVER_KEY, DriverSpec).version_file
    module = host.get_fact(NvidiaModule, version_file=version_file)
    try:
        devices = plan_lxc_devices(len(gpus), release.major_minor, nodes.caps, nodes.majors, spec.video_gid)
    except PlanError as error:
        if module is None:
            # Before 8.1 the raw lines need the uvm major, known once the driver this run installs loads.
            logger.warning(f"{host.print_prefix}container not converged yet: {error}; run again")
            return
        raise OperationError(f"{host.name}: {error}") from None
    api = pve_client(host)
    timeout_s = api_spec(host.data).task_timeout_s

    lxc_container(
        name="Create or converge the container with the GPU device entries",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        config=container_config(spec, devices),
        create=create_keys(spec),
        timeout_s=timeout_s,
    )
    lxc_raw_lines(
        name="Write the raw lxc lines (devices before Proxmox 8.1, /dev/shm)",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        wanted=raw_lines(spec, devices),
        replace=f"{SHM_ENTRY}: {SHM_PREFIX}",
    )
    lxc_running(name="Start the container", api=api, node=node.name, vmid=spec.vmid, timeout_s=timeout_s)
    container_driver(
        name="Check the container's driver equals the host's kernel module",
        vmid=spec.vmid,
        host_module=None if module is None else module.version,
        container_userspace=host.get_fact(ContainerDriverVersion, vmid=spec.vmid),
    )


@deploy("Stop the GPU container for another profile")
def lxc_gpu_parked() -> None:
    """`vm` / `baremetal`: the `lxc` container stopped (when `pve_host.allow_reboot`) and `onboot: 0`.

    A host without `lxc` data has no managed container: nothing to do.
    """
    node = node_of(host)
    if host.data.get(LXC_KEY) is None:
        return
    spec = spec_of(host.data, LXC_KEY, LxcSpec)
    lxc_parked(
        name="Stop the container and keep it from starting at boot",
        api=pve_client(host),
        node=node.name,
        vmid=spec.vmid,
        profile=node.profile,
        allow_stop=spec_of(host.data, HOST_KEY, HostSpec).allow_reboot,
        timeout_s=api_spec(host.data).task_timeout_s,
    )
