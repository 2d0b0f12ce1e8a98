"""Which declared features need a key only root@pam may write, refused at inventory validation when pvegpu
has no root path to the node. Pure.

With `pve.backend: https` and no root path (`pve.root_ssh: false`: `PveApiSpec.root_user` None), Proxmox
would refuse these writes half-way through a run (`only root can set 'hookscript' config`,
pvegpu.models.pve_root_only). So each one is a problem line before any host is touched, naming the field,
the key, the identity, and both ways out:

    vm.self_heal: the API token pvegpu@pve!deploy cannot set 'hookscript' (Proxmox allows it to root@pam
    only): set vm.self_heal: off, or let pvegpu reach the node as root over SSH (pve.root_ssh: true)
"""

from __future__ import annotations

from dataclasses import dataclass

from pvegpu.models.lxc import LxcSpec
from pvegpu.models.model import ModelSpec
from pvegpu.models.pve_api import ROOT_PATH_WAY_OUT, PveApiSpec, root_ssh_problem
from pvegpu.models.vm import VmSpec


@dataclass(frozen=True)
class RootOnlyFeature:
    """A declared feature (`field`) that writes the root-only `key`; `way_out` turns it off; `allows`: what
    Proxmox allows to root@pam only, as the line names it."""

    field: str
    key: str
    way_out: str
    allows: str = "it"


def vm_root_only_features(vm: VmSpec) -> tuple[RootOnlyFeature, ...]:
    """The features `vm` asks for that write a root-only VM key (pvegpu/plan/vm.py `vm_config`)."""
    features = []
    if vm.self_heal != "off":
        features.append(RootOnlyFeature("vm.self_heal", "hookscript", "set vm.self_heal: off"))
    if vm.mmio == "args":
        features.append(RootOnlyFeature("vm.mmio", "args", "set vm.mmio: phys-bits"))
    if vm.p2p != "off":
        features.append(RootOnlyFeature("vm.p2p", "args", "set vm.p2p: off"))
    if vm.hugepages is not None:
        features.append(RootOnlyFeature("vm.hugepages", "hugepages", "leave vm.hugepages unset"))
    if vm.numa_layout == "host":
        features.append(RootOnlyFeature("vm.numa_layout", "affinity", "set vm.numa_layout: flat"))
    if vm.host_reserved_cores is not None:
        features.append(
            RootOnlyFeature("vm.host_reserved_cores", "affinity", "leave vm.host_reserved_cores unset")
        )
    return tuple(features)


# The lxc profile passes the host's NVIDIA device nodes as `devN` entries (pvegpu/plan/lxc.py; pve-container
# LXC.pm: `configuring device passthrough is only allowed for root@pam`).
LXC_DEVICES = RootOnlyFeature("node.profile", "devN", "use node.profile vm or baremetal")
# The lxc profile bind-mounts the node's model store (pvegpu/plan/lxc.py `store_mount`; pve-container LXC.pm:
# `mount point type bind is only allowed for root@pam`).
LXC_MODEL = RootOnlyFeature("model", "mp0", "leave `model` unset", allows="bind mounts")


def root_only_problems(
    profile: str,
    vm: VmSpec | None,
    lxc: LxcSpec | None,
    pve: PveApiSpec,
    host_ssh_user: object,
    *,
    model: ModelSpec | None = None,
) -> list[str]:
    """One `<field>: ...` line (module docstring) per feature of the host's profile that needs a root-only
    key, when there is no root path; empty when there is one, or nothing needs it (`model`: the node's model
    store, a bind mount on the lxc profile). A root path over an SSH user that is not root needs `pve.sudo`
    (`root_ssh_problem`; `host_ssh_user`: the host's pyinfra `ssh_user`, None when unset)."""
    if pve.root_user is not None:
        problem = root_ssh_problem(pve, host_ssh_user)
        return [] if problem is None else [problem]
    features: tuple[RootOnlyFeature, ...] = ()
    if profile == "vm" and vm is not None:
        features = vm_root_only_features(vm)
    elif profile == "lxc" and lxc is not None:
        features = (LXC_DEVICES, *((LXC_MODEL,) if model is not None else ()))
    return [
        f"{feature.field}: the API token {pve.api_user} cannot set '{feature.key}' (Proxmox allows "
        f"{feature.allows} to root@pam only): {feature.way_out}, or {ROOT_PATH_WAY_OUT}"
        for feature in features
    ]
