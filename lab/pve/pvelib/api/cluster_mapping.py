"""`/cluster/mapping/pci[/{id}]` (pve-manager API2/Cluster/Mapping/PCI.pm)."""

from __future__ import annotations

import re
from typing import Any

from .. import access
from ..errors import DieError
from ..formats import BOOL, MAP_FMT, verify_configid, verify_configid_list, verify_node
from ..jsonschema import P
from ..pmxcfs import locked, write_atomic
from ..rest import Call, Endpoint, Json
from ..sectionconfig import (
    MAPPING_CFG,
    MAPPING_OPTIONS,
    Section,
    map_entry,
    mapping_state,
    write_mapping_cfg,
)
from ..settings import local_node
from ..sysfs import assert_valid


def _section_json(section: Section) -> dict[str, Any]:
    return {"map": list(section.map), "type": "pci", **section.options}


def list_mappings(call: Call) -> Json:
    sections, digest = mapping_state(call.settings)
    check_node = call.params.get("check-node")
    if check_node is not None:
        local_node(call.settings, check_node)
    result = []
    rpcenv = call.rpcenv  # Mapping/PCI.pm index: only the ids with Mapping.Modify, Use or Audit
    privs = ("Mapping.Modify", "Mapping.Use", "Mapping.Audit")
    for section in sections:
        if not rpcenv.check_any(rpcenv.user, f"/mapping/pci/{section.id}", privs, noerr=True):
            continue
        entry = {"id": section.id, "digest": digest, **_section_json(section)}
        if check_node is not None:
            checks = []
            lines = [map_entry(m) for m in section.map]
            mine = [m for m in lines if m.get("node") == check_node]
            if not mine:
                checks.append({"severity": "warning", "message": f"No mapping for node {check_node}."})
            for line in mine:
                try:
                    assert_valid(call.settings, section.id, line, section)
                except DieError as error:
                    checks.append({"severity": "error", "message": f"Invalid configuration: {error.text}"})
            entry["checks"] = checks
        result.append(entry)
    return result


def get_mapping(call: Call) -> Json:
    sections, digest = mapping_state(call.settings)
    for section in sections:
        if section.id == call.path_params["id"]:
            return {**_section_json(section), "digest": digest}
    raise DieError(f"mapping '{call.path_params['id']}' not found\n")


def _mapping_options(params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in MAPPING_OPTIONS if k in params}


def create_mapping(call: Call) -> Json:
    with locked(call.settings):
        sections, _ = mapping_state(call.settings)
        mapping_id = call.params["id"]
        if any(s.id == mapping_id for s in sections):
            raise DieError(f"create hardware mapping failed: pci ID '{mapping_id}' already defined\n")
        sections.append(Section(mapping_id, list(call.params["map"]), _mapping_options(call.params)))
        write_atomic(call.settings.path(MAPPING_CFG), write_mapping_cfg(sections))
    return None


def update_mapping(call: Call) -> Json:
    prefix = "update hardware mapping failed: "
    mapping_id = call.path_params["id"]
    with locked(call.settings):
        sections, digest = mapping_state(call.settings)
        if "digest" in call.params and call.params["digest"] != digest:
            raise DieError(
                f"{prefix}detected modified configuration - file changed by other user? Try again.\n"
            )
        section = next((s for s in sections if s.id == mapping_id), None)
        if section is None:
            raise DieError(f"{prefix}pci ID '{mapping_id}' does not exist\n")
        deletes = [k for k in re.split(r"[,;\s]+", call.params.get("delete", "")) if k]
        for key in deletes:
            if key in call.params:
                raise DieError(f"{prefix}cannot set and delete property '{key}' at the same time!\n")
            if key == "map":
                raise DieError(f"{prefix}unable to delete required option 'map'\n")
        if "map" not in call.params:
            raise DieError(f"{prefix}missing value for required option 'map'\n")
        section.map = list(call.params["map"])
        section.options.update(_mapping_options(call.params))
        for key in deletes:
            section.options.pop(key, None)
        write_atomic(call.settings.path(MAPPING_CFG), write_mapping_cfg(sections))
    return None


def delete_mapping(call: Call) -> Json:
    with locked(call.settings):
        sections, _ = mapping_state(call.settings)
        kept = [s for s in sections if s.id != call.path_params["id"]]
        if len(kept) != len(sections):
            write_atomic(call.settings.path(MAPPING_CFG), write_mapping_cfg(kept))
    return None


MAPPING_P: dict[str, P] = {
    "map": P(type="array", optional=False, items=P(props=MAP_FMT)),
    "description": P(max_length=4096),
    "mdev": BOOL,
    "live-migration-capable": BOOL,
}


_MAPPING_ANY = tuple(
    access.Perm("/mapping/pci/{id}", (priv,)) for priv in ("Mapping.Use", "Mapping.Modify", "Mapping.Audit")
)


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"cluster/mapping/pci", Endpoint("GET", {"check-node": P(verify=verify_node)}, list_mappings)),
    (
        "create",
        r"cluster/mapping/pci",
        Endpoint(
            "POST", {"id": P(optional=False, verify=verify_configid), **MAPPING_P}, create_mapping, True
        ),
    ),
    ("get", r"cluster/mapping/pci/(?P<id>[^/]+)", Endpoint("GET", {}, get_mapping)),
    (
        "set",
        r"cluster/mapping/pci/(?P<id>[^/]+)",
        Endpoint(
            "PUT",
            {
                **MAPPING_P,
                "map": P(type="array", items=P(props=MAP_FMT)),
                "delete": P(verify=verify_configid_list, list_format=True),
                "digest": P(max_length=64),
            },
            update_mapping,
            True,
        ),
    ),
    ("delete", r"cluster/mapping/pci/(?P<id>[^/]+)", Endpoint("DELETE", {}, delete_mapping, True)),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/cluster/mapping/pci"): access.ALL_USERS,
    ("POST", "/cluster/mapping/pci"): access.Perm("/mapping/pci", ("Mapping.Modify",)),
    ("GET", "/cluster/mapping/pci/{id}"): access.Or(_MAPPING_ANY),
    ("PUT", "/cluster/mapping/pci/{id}"): access.Perm("/mapping/pci/{id}", ("Mapping.Modify",)),
    ("DELETE", "/cluster/mapping/pci/{id}"): access.Perm("/mapping/pci", ("Mapping.Modify",)),
}
