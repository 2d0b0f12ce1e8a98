"""site: every step of a host's profile, in the order its plan gives (pvegpu/plan/profile.py says what each
profile owns and why the order is so).

`node_site` (Proxmox nodes): the old profile's guests let go of the GPUs and the host driver's boot units go
before the host rebinds the GPUs; the host; the model's store (`model`, every profile); then `vm`: the PCI
mappings and the VM; `lxc` / `baremetal`: the host driver and, on `lxc`, the container — unless the GPUs stay
on vfio-pci until a reboot that is not allowed, which the run then says. `serving` (serving hosts): the driver
where the host needs one, then SGLang. Each ends with the node exporter and the host's gauges
(roles/node_exporter.py), as the run leaves them.

The one module in roles/ that imports roles (pyproject's import contract exempts it alone): the table of
contents of deploy/site.py and deploy/guest.py, whose steps follow the plan, which an entry point (no logic)
cannot read.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.context import host

from pvegpu.operations.pve_guest import CT, VM
from pvegpu.run.host_state import read_serving_host
from pvegpu.run.plan import plan_of
from pvegpu.run.read_ahead import read_vm_resources_ahead
from roles.guest_parked import guest_parked_role
from roles.host_driver import host_driver_parked_role
from roles.lxc_gpu import lxc_gpu
from roles.model_store import model_store
from roles.node_exporter import node_exporter
from roles.nvidia_driver import nvidia_driver
from roles.pci_mapping import pci_mapping
from roles.pve_host import pve_host
from roles.q35_vm import q35_vm_role
from roles.sglang import sglang


def node_site() -> None:
    """The node's steps (module docstring); each role names its own operations, as when run alone."""
    steps = plan_of(host).steps
    assert steps is not None  # planned for every host in pve_nodes, the only group this runs on
    if steps.vm:
        read_vm_resources_ahead()
    if steps.park_container:
        guest_parked_role(CT)
    if steps.park_vm:
        guest_parked_role(VM)
    if steps.park_host_driver:
        host_driver_parked_role()
    pve_host()
    model_store()  # before the guest that reads it: the VM's virtiofs and the container's mp0 need it there
    if steps.vm:
        pci_mapping()
        q35_vm_role()
    if steps.waiting is not None:
        logger.warning(f"{host.print_prefix}{steps.waiting}")
    if steps.host_driver:
        nvidia_driver(placement="pve-host")
    if steps.container:
        lxc_gpu()
    node_exporter(serving=False)


def serving() -> None:
    """The serving host's driver and SGLang (module docstring)."""
    read_serving_host(host)  # its hardware and state in one command, before the plan would read the hardware
    steps = plan_of(host).serving
    assert steps is not None  # planned for every host in a serving group, the only groups this runs on
    if steps.driver is not None:
        nvidia_driver(placement=steps.driver)
    if steps.sglang:
        sglang()
    node_exporter(serving=True)
