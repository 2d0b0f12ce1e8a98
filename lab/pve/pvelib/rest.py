"""PVE::RESTHandler's pieces: the pvesh commands and their HTTP methods, an endpoint (parameters, handler,
route options) and one call of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import access

if TYPE_CHECKING:
    from .jsonschema import P
    from .settings import Settings

CMDS = {"get": "GET", "set": "PUT", "create": "POST", "delete": "DELETE"}


Json = Any


@dataclass(frozen=True)
class Endpoint:
    method: str
    params: dict[str, P]
    handler: Callable[[Call], Json]
    returns_null: bool = False
    extra: Callable[[str], P | None] | None = None  # config keys accepted on top of `params`


@dataclass
class Call:
    """One API call: `rpcenv` says who makes it (root@pam under pvesh; the API token under pveproxy)."""

    settings: Settings
    path_params: dict[str, str]
    params: dict[str, Any]
    out: list[str] = field(default_factory=list)
    rpcenv: access.RpcEnv = field(default_factory=access.RpcEnv)


def schema_of(endpoint: Endpoint, name: str) -> P | None:
    if name in endpoint.params:
        return endpoint.params[name]
    return endpoint.extra(name) if endpoint.extra else None


# Each endpoint's `permissions` clause (checked before its parameters, as pveproxy does), by method and path:
# qemu-server API2/Qemu.pm and Qemu/Agent.pm, pve-container API2/LXC.pm, LXC/Config.pm, LXC/Status.pm,
# pve-manager API2/Cluster/Mapping/PCI.pm and API2/Tasks.pm, pve-storage API2/Storage/Config.pm, Content.pm,
# Status.pm, pve-access-control API2/AccessControl.pm. `ALL_USERS`: any user, the checks are inside.
VMS = "/vms/{vmid}"
