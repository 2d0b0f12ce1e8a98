"""lxc_gpu: the `lxc` profile's container on the host's NVIDIA driver, through the Proxmox API.

Created or converged with a `devN:` entry for every GPU (`/dev/nvidiaN`) and for nvidiactl, nvidia-uvm,
nvidia-uvm-tools, nvidia-modeset and the nvidia-caps nodes (Proxmox >= 8.1); before 8.1 the same devices
as raw `lxc.cgroup2` / `lxc.mount.entry` lines with majors from /proc/devices. A /dev/shm of
`lxc.shm_gib` for NCCL. Started. Every run: the container's userspace driver must equal the host's
kernel module (both versions reported when not). Plans: pvegpu/plan/lxc.py.

The other profiles' side, the container stopped and `onboot: 0`, is roles/guest_parked.py's.

The host driver (kernel module, device nodes at boot) is roles/nvidia_driver.py's `pve-host` placement,
run before this; the container's userspace driver is its `container` placement (group `lxc_guests`).
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.facts.boot import PveVersion
from pvegpu.facts.lxc_devices import ContainerDriverVersion, NvidiaDeviceNodes
from pvegpu.facts.nvidia import NvidiaModule
from pvegpu.inventory.validate import KNOWN_HOSTS_KEY
from pvegpu.local.create_records import ledger_beside
from pvegpu.operations.lxc import container_driver, lxc_container, lxc_raw_lines
from pvegpu.operations.pve_guest import CT, Guest, Ownership, guest_running, refuse_foreign
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import (
    SHM_ENTRY,
    SHM_PREFIX,
    container_config,
    create_keys,
    plan_lxc_devices,
    raw_lines,
)
from pvegpu.plan.ownership import owner_id
from pvegpu.pve.host_client import pve_client
from pvegpu.run.plan import plan_of


@deploy("Create and start the GPU container")
def lxc_gpu() -> None:
    """Container config + devices, raw lines, started, driver versions compared."""
    plan = plan_of(host)
    node, spec = plan.specs.node, plan.specs.lxc
    if spec is None:
        raise OperationError(f"{host.name}: profile lxc needs `lxc` data (the container: vmid, ostemplate)")
    release = host.get_fact(PveVersion)
    if release is None:
        raise OperationError(f"{host.name}: profile lxc needs Proxmox VE (no pveversion on this host)")
    gpus = plan.topology.gpus
    nodes = host.get_fact(NvidiaDeviceNodes)
    module = host.get_fact(NvidiaModule, version_file=plan.specs.driver.version_file)
    try:
        devices = plan_lxc_devices(len(gpus), release.major_minor, nodes.caps, nodes.majors, spec.video_gid)
    except PlanError as error:
        if module is None:
            # Before 8.1 the raw lines need the uvm major, known once the driver this run installs loads.
            logger.warning(f"{host.print_prefix}container not converged yet: {error}; run again")
            return
        raise OperationError(f"{host.name}: {error}") from None
    api = pve_client(host)
    timeout_s = plan.specs.pve.task_timeout_s
    pve = plan.specs.pve
    ownership = Ownership(owner_id(pve.owner, pve.cluster, node.name), spec.adopt, "lxc.adopt")
    refuse_foreign(Guest(CT, api, node.name, spec.vmid), ownership)  # before anything of the run is written
    config, create = container_config(spec, devices), create_keys(spec)

    lxc_container(
        name="Create or converge the container with the GPU device entries",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        config=config,
        create=create,
        timeout_s=timeout_s,
        # the identity the create runs as (root@pam: its devN entries are root-only): its task's user
        ledger=ledger_beside(
            host.data.get(KNOWN_HOSTS_KEY),
            api.acts_as("POST", f"/nodes/{node.name}/lxc", {**config, **create}),
        ),
        ownership=ownership,
    )
    lxc_raw_lines(
        name="Write the raw lxc lines (devices before Proxmox 8.1, /dev/shm)",
        api=api,
        node=node.name,
        vmid=spec.vmid,
        wanted=raw_lines(spec, devices),
        replace=f"{SHM_ENTRY}: {SHM_PREFIX}",
    )
    guest_running(
        name="Start the container", kind=CT, api=api, node=node.name, vmid=spec.vmid, timeout_s=timeout_s
    )
    container_driver(
        name="Check the container's driver equals the host's kernel module",
        vmid=spec.vmid,
        host_module=None if module is None else module.version,
        container_userspace=host.get_fact(ContainerDriverVersion, vmid=spec.vmid),
    )
