"""lxc_gpu: the `lxc` profile's container on the host's NVIDIA driver, through the Proxmox API.

Created or converged with a `devN:` entry for every GPU (`/dev/nvidiaN`) and for nvidiactl, nvidia-uvm,
nvidia-uvm-tools, nvidia-modeset and the nvidia-caps nodes (Proxmox >= 8.1); before 8.1 the same devices
as raw `lxc.cgroup2` / `lxc.mount.entry` lines with majors from /proc/devices. A /dev/shm of
`lxc.shm_gib` for NCCL. Started. Every run: the container's userspace driver must equal the host's
kernel module (both versions reported when not). Plans: pvegpu/plan/lxc.py, from what
pvegpu/run/container.py reads.

The other profiles' side, the container stopped and `onboot: 0`, is roles/guest_parked.py's.

The host driver (kernel module, device nodes at boot) is roles/nvidia_driver.py's `pve-host` placement,
run before this; the container's userspace driver is its `container` placement (group `lxc_guests`).
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.operations.lxc import container_driver, lxc_container, lxc_raw_lines
from pvegpu.operations.pve_guest import CT, Guest, Ownership, guest_running, refuse_foreign
from pvegpu.plan.lxc import SHM_ENTRY, SHM_PREFIX
from pvegpu.pve.host_client import pve_client
from pvegpu.run.container import container_plan_of, container_userspace
from pvegpu.run.plan import plan_failures, plan_of
from pvegpu.run.vm import guest_ledger


@deploy("Create and start the GPU container")
def lxc_gpu() -> None:
    """Container config + devices, raw lines, started, driver versions compared."""
    plan = plan_of(host)
    node, pve = plan.specs.node, plan.specs.pve
    with plan_failures(host):
        container = container_plan_of(host)
    if container.waiting is not None:
        logger.warning(f"{host.print_prefix}{container.waiting}")
        return
    spec, timeout_s, api = container.spec, pve.task_timeout_s, pve_client(host)
    ownership = Ownership(plan.owner, spec.adopt, "lxc.adopt")
    guest = Guest(CT, api, node.name, spec.vmid)  # the one value every operation below acts on
    refuse_foreign(guest, ownership)  # before anything of the run is written
    lxc_container(
        name="Create or converge the container with the GPU device entries",
        guest=guest,
        container=container,
        timeout_s=timeout_s,
        # the identity the create runs as (root@pam: its devN entries are root-only): its task's user
        ledger=guest_ledger(host, "lxc", container.created_with),
        ownership=ownership,
    )
    lxc_raw_lines(
        name="Write the raw lxc lines (devices before Proxmox 8.1, /dev/shm)",
        guest=guest,
        wanted=container.raw,
        replace=f"{SHM_ENTRY}: {SHM_PREFIX}",
    )
    guest_running(name="Start the container", guest=guest, timeout_s=timeout_s)
    container_driver(
        name="Check the container's driver equals the host's kernel module",
        vmid=spec.vmid,
        host_module=container.host_module,
        container_userspace=container_userspace(host, spec.vmid),
    )
