"""nvidia_driver: NVIDIA's open driver from the CUDA apt repository, pinned; nouveau off; persistence on;
reboot only when the loaded module is not the pinned one and the inventory allows it; then verify.

Bad data the models cannot see alone (the proprietary flavour for Blackwell ids, a distribution NVIDIA has no
repository for) fails while operations are collected, before any host is changed.
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api.deploy import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import host
from pyinfra.facts.server import KernelVersion, LinuxDistribution
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.inventory import NODE_KEY, NodeSpec, spec_of
from pvegpu.operations.nvidia import cuda_repository, driver_module, driver_verified
from pvegpu.operations.render import render
from pvegpu.plan.driver import PACKAGE, apt_source_line, cuda_distro, flavour_problems, keyring_url
from pvegpu.plan.errors import PlanError

NOUVEAU_DROP_IN = "/etc/modprobe.d/pvegpu-nouveau.conf"
PREFERENCES = "/etc/apt/preferences.d/pvegpu-nvidia"


@deploy("Install the NVIDIA driver")
def nvidia_driver() -> None:
    """CUDA repository, pinned open driver + headers/dkms, nouveau blacklist, persistenced, module, verify."""
    data = {key: host.data.get(key) for key in (NODE_KEY, DRIVER_KEY) if host.data.get(key) is not None}
    node = spec_of(data, NODE_KEY, NodeSpec)
    driver = spec_of(data, DRIVER_KEY, DriverSpec)
    release = host.get_fact(LinuxDistribution)["release_meta"]
    try:
        problems = flavour_problems(driver, node.gpus.ids)
        if problems:
            raise PlanError("\n".join(problems))
        distro = cuda_distro(release.get("ID"), release.get("VERSION_ID"))
    except PlanError as error:
        raise OperationError(f"{host.name}: {error}") from None

    cuda_repository(
        name="Add NVIDIA's CUDA apt repository",
        source_line=apt_source_line(driver, distro),
        list_path=f"/etc/apt/sources.list.d/cuda-{distro}-x86_64.list",
        keyring_url=keyring_url(driver, distro),
    )
    files.put(
        name=f"Pin NVIDIA's driver packages to {driver.version}",
        src=StringIO(render("nvidia_driver/apt-preferences-pvegpu-nvidia.j2", version=driver.version)),
        dest=PREFERENCES,
        mode="644",
    )
    packages = apt.packages(
        name=f"Install the {driver.flavour} NVIDIA driver {driver.version} with headers and dkms",
        packages=[
            f"{PACKAGE[driver.flavour]}={driver.package_version}",
            "dkms",
            f"linux-headers-{host.get_fact(KernelVersion)}",
        ],
    )
    blacklist = files.put(
        name="Blacklist nouveau",
        src=StringIO(render("nvidia_driver/modprobe-pvegpu-nouveau.conf.j2")),
        dest=NOUVEAU_DROP_IN,
        mode="644",
    )
    server.shell(
        name="Refresh the initramfs without nouveau",
        commands=["update-initramfs -u -k all"],
        _if=any_changed(blacklist),
    )
    systemd.service(
        name="Enable and start nvidia-persistenced",
        service="nvidia-persistenced.service",
        running=True,
        enabled=True,
    )
    installing = packages.will_change
    driver_module(
        name="Load the pinned kernel module (reboot when allowed)", driver=driver, installing=installing
    )
    driver_verified(
        name="Verify the GPUs, module flavour and version",
        driver=driver,
        gpu_count=node.gpus.count,
        installing=installing,
    )
