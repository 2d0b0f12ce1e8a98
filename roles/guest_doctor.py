"""guest_doctor: on a VM's guest, which boots its own distribution's kernel with pvegpu's NVIDIA driver,
whether the kernel it boots next has the module, as the driver role's reboot requires
(pvegpu/plan/kernel_guard.py); said once the driver is installed. Read-only: one command (the kernels and
DKMS's tree). A bare-metal host's next boot is roles/doctor.py's."""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.run.plan import plan_of
from pvegpu.run.reports import log_next_boot


@deploy("Report the guest's next boot")
def guest_next_boot() -> None:
    """A warning per problem of the guest's next kernel (with Debian's fix), or the kernel and its module."""
    plan = plan_of(host)
    if plan.specs.node.profile != "vm" or plan.serving is None or plan.serving.driver != "guest":
        return
    log_next_boot(host, plan.specs.driver.version, proxmox=False, installed_only=True)
