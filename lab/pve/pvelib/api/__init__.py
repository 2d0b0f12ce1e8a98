"""The API's route table (every api/<subtree>.py's `ROUTES` and `PERMISSIONS`) and one call through it
(`call_api`: permissions, parameters, handler), for pvesh (lab/pve/pvesh.py) and pveproxy
(lab/pve/pveproxy.py)."""

from __future__ import annotations

import re
from typing import Any

from .. import access
from ..errors import ParamError
from ..formats import NODE_P, VMID_P, verify_configid, verify_storage_id
from ..jsonschema import P, add_error, check_requires, check_value
from ..rest import Call, Endpoint, Json, schema_of
from ..settings import Settings, local_node
from . import (
    access_control,
    cluster,
    cluster_mapping,
    nodes_lxc,
    nodes_qemu,
    nodes_qemu_agent,
    nodes_qemu_status,
    nodes_storage,
    nodes_tasks,
    storage,
    version,
)

ROUTES: list[tuple[str, str, Endpoint]] = [
    *version.ROUTES,
    *access_control.ROUTES,
    *cluster_mapping.ROUTES,
    *nodes_qemu.ROUTES,
    *nodes_lxc.ROUTES,
    *cluster.ROUTES,
    *nodes_storage.ROUTES,
    *nodes_qemu_status.ROUTES,
    *nodes_qemu_agent.ROUTES,
    *storage.ROUTES,
    *nodes_tasks.ROUTES,
]
PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    **version.PERMISSIONS,
    **access_control.PERMISSIONS,
    **cluster_mapping.PERMISSIONS,
    **nodes_qemu.PERMISSIONS,
    **nodes_lxc.PERMISSIONS,
    **cluster.PERMISSIONS,
    **nodes_storage.PERMISSIONS,
    **nodes_qemu_status.PERMISSIONS,
    **nodes_qemu_agent.PERMISSIONS,
    **storage.PERMISSIONS,
    **nodes_tasks.PERMISSIONS,
}
PATH_PARAMS: dict[str, P] = {
    "node": NODE_P,
    "storage": P(optional=False, verify=verify_storage_id),
    "vmid": VMID_P,
    "id": P(optional=False, verify=verify_configid),
    "upid": P(optional=False),
    "volume": P(optional=False),
}


def find_route(cmd: str, path: str) -> tuple[Endpoint, dict[str, str]] | None:
    clean = path.strip("/")
    for route_cmd, pattern, endpoint in ROUTES:
        match = re.fullmatch(pattern, clean)
        if route_cmd == cmd and match:
            return endpoint, match.groupdict()
    return None


def route_template(pattern: str) -> str:
    """A route's path as Proxmox writes it: `/nodes/{node}/qemu/{vmid}/config`."""
    return "/" + re.sub(r"\(\?P<(\w+)>(?:\[\^/\]\+|\.\+)\)", r"{\1}", pattern)  # `.+`: a volid's slashes


def endpoint_permissions(cmd: str, path: str) -> access.Permissions:
    """The `permissions` clause of the endpoint `cmd path` routes to (None: none known, root@pam only)."""
    clean = path.strip("/")
    for route_cmd, pattern, endpoint in ROUTES:
        if route_cmd == cmd and re.fullmatch(pattern, clean):
            return PERMISSIONS.get((endpoint.method, route_template(pattern)))
    return None


def call_api(settings: Settings, rpcenv: access.RpcEnv, cmd: str, path: str, raw: dict[str, Any]) -> Json:
    """One API call by `rpcenv.user` to an existing route (`find_route`), `raw` its options as strings
    (lists for arrays): the endpoint's permissions clause (before the parameters, in pveproxy's order),
    the parameters verified (JSONSchema), then its handler. Raises access.PermissionDenied, ParamError
    or DieError."""
    found = find_route(cmd, path)
    assert found is not None
    endpoint, path_values = found
    rpcenv.check_api2_permissions(endpoint_permissions(cmd, path), {**path_values, **raw})
    errors: dict[str, str] = {}
    for key, value in path_values.items():
        check_value(key, PATH_PARAMS[key], value, errors)
    params: dict[str, Any] = {}
    for key, value in raw.items():
        schema = schema_of(endpoint, key)
        assert schema is not None
        params[key] = check_value(key, schema, value, errors)
    for key, schema in endpoint.params.items():
        if not schema.optional and key not in raw:
            add_error(errors, key, "property is missing and it is not optional")
    check_requires("", endpoint.params, raw, errors)
    if errors:
        raise ParamError(errors)
    if "node" in path_values:
        local_node(settings, path_values["node"])
    return endpoint.handler(Call(settings, dict(path_values), params, rpcenv=rpcenv))
