"""`/cluster/mapping`, `/cluster/mapping/pci[/{id}]` and `/cluster/mapping/dir[/{id}]` (pve-manager
API2/Cluster/Mapping.pm, Mapping/PCI.pm, Mapping/Dir.pm). The two subtrees are the same code upstream but for
the file, the section type, the options, the lock's error prefix and Dir's map-list check; `_Kind` holds those
differences, one set of handlers serves both."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import access
from ..errors import DieError
from ..formats import BOOL, verify_configid, verify_configid_list, verify_node
from ..jsonschema import P
from ..mapping_dir import assert_valid as assert_valid_dir
from ..mapping_dir import assert_valid_map_list, node_entries
from ..pmxcfs import locked, write_atomic
from ..rest import Call, Endpoint, Json
from ..sectionconfig import (
    DIR_MAPPING,
    PCI_MAPPING,
    MappingKind,
    Section,
    map_entry,
    mapping_state,
    write_mapping_cfg,
)
from ..settings import local_node
from ..sysfs import assert_valid as assert_valid_pci

if TYPE_CHECKING:
    from ..settings import Settings


@dataclass(frozen=True)
class _Kind:
    """What tells Mapping/PCI.pm and Mapping/Dir.pm apart."""

    mapping: MappingKind
    failed: str  # lock_<type>_config's errmsg: `create <failed> mapping failed`, `update ...`
    deleted: str  # the delete handler's errmsg
    entries: Callable[[Section, str], list[dict[str, str]]]  # a node's entries (get_node_mapping)
    assert_valid: Callable[[Settings, Section, dict[str, str]], None]  # one entry, on this node
    assert_map: Callable[[Settings, list[str]], None] | None  # create and update: the whole map list

    @property
    def type(self) -> str:
        return self.mapping.type


def _pci_entries(section: Section, node: str) -> list[dict[str, str]]:
    return [entry for entry in map(map_entry, section.map) if entry.get("node") == node]


PCI = _Kind(
    PCI_MAPPING,
    "hardware",
    "delete pci mapping failed",
    _pci_entries,
    lambda settings, section, entry: assert_valid_pci(settings, section.id, entry, section),
    None,
)


DIR = _Kind(
    DIR_MAPPING,
    "directory",
    "delete dir mapping failed",
    node_entries,
    lambda settings, _section, entry: assert_valid_dir(settings, entry),
    assert_valid_map_list,
)


def _section_json(kind: _Kind, section: Section) -> dict[str, Any]:
    return {"map": list(section.map), "type": kind.type, **section.options}


def list_mappings(kind: _Kind, call: Call) -> Json:
    """index: only the ids the user has Mapping.Modify, Use or Audit on; with `check-node` each entry's
    `checks` (`No mapping for node <node>.` a warning, each invalid entry of that node an error)."""
    sections, digest = mapping_state(call.settings, kind.mapping)
    check_node = call.params.get("check-node")
    if check_node is not None:
        local_node(call.settings, check_node)
    result = []
    rpcenv = call.rpcenv
    privs = ("Mapping.Modify", "Mapping.Use", "Mapping.Audit")
    for section in sections:
        if not rpcenv.check_any(rpcenv.user, f"/mapping/{kind.type}/{section.id}", privs, noerr=True):
            continue
        entry = {"id": section.id, "digest": digest, **_section_json(kind, section)}
        if check_node is not None:
            checks = []
            mine = kind.entries(section, check_node)
            if not mine:
                checks.append({"severity": "warning", "message": f"No mapping for node {check_node}."})
            for line in mine:
                try:
                    kind.assert_valid(call.settings, section, line)
                except DieError as error:
                    checks.append({"severity": "error", "message": f"Invalid configuration: {error.text}"})
            entry["checks"] = checks
        result.append(entry)
    return result


def get_mapping(kind: _Kind, call: Call) -> Json:
    sections, digest = mapping_state(call.settings, kind.mapping)
    for section in sections:
        if section.id == call.path_params["id"]:
            return {**_section_json(kind, section), "digest": digest}
    raise DieError(f"mapping '{call.path_params['id']}' not found\n")


def _options(kind: _Kind, params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in kind.mapping.options if k in params}


def create_mapping(kind: _Kind, call: Call) -> Json:
    """create: Dir's map-list check before the lock (unprefixed), then `<type> ID '<id>' already defined`
    under it (prefixed `create <failed> mapping failed: `)."""
    mapping_id = call.params["id"]
    if kind.assert_map is not None:
        kind.assert_map(call.settings, list(call.params["map"]))
    with locked(call.settings):
        sections, _ = mapping_state(call.settings, kind.mapping)
        if any(s.id == mapping_id for s in sections):
            raise DieError(
                f"create {kind.failed} mapping failed: {kind.type} ID '{mapping_id}' already defined\n"
            )
        sections.append(Section(mapping_id, list(call.params["map"]), _options(kind, call.params)))
        write_atomic(call.settings.path(kind.mapping.cfg), write_mapping_cfg(sections, kind.mapping))
    return None


def update_mapping(kind: _Kind, call: Call) -> Json:
    """update, under the lock and in its order: the digest (PVE::Tools::assert_if_modified), the id, the
    required `map` (check_config with create), Dir's map-list check, then SectionConfig delete_from_config's
    refusals for each key of `delete`; every text prefixed `update <failed> mapping failed: `."""
    prefix = f"update {kind.failed} mapping failed: "
    mapping_id = call.path_params["id"]
    with locked(call.settings):
        sections, digest = mapping_state(call.settings, kind.mapping)
        try:
            if "digest" in call.params and call.params["digest"] != digest:
                raise DieError("detected modified configuration - file changed by other user? Try again.\n")
            section = next((s for s in sections if s.id == mapping_id), None)
            if section is None:
                raise DieError(f"{kind.type} ID '{mapping_id}' does not exist\n")
            if "map" not in call.params:
                raise DieError("missing value for required option 'map'\n")
            if kind.assert_map is not None:
                kind.assert_map(call.settings, list(call.params["map"]))
            deletes = [k for k in re.split(r"[,;\s]+", call.params.get("delete", "")) if k]
            for key in deletes:
                if key != "map" and key not in kind.mapping.options:
                    raise DieError(f"no such option '{key}'\n")
                if key == "map":
                    raise DieError(f"unable to delete required option '{key}'\n")
                if key in call.params:
                    raise DieError(f"cannot set and delete property '{key}' at the same time!\n")
        except DieError as error:
            raise DieError(prefix + error.text) from None
        section.map = list(call.params["map"])
        section.options.update(_options(kind, call.params))
        for key in deletes:
            section.options.pop(key, None)
        write_atomic(call.settings.path(kind.mapping.cfg), write_mapping_cfg(sections, kind.mapping))
    return None


def delete_mapping(kind: _Kind, call: Call) -> Json:
    """delete: an unknown id is no error (the file is written back as it was)."""
    with locked(call.settings):
        sections, _ = mapping_state(call.settings, kind.mapping)
        kept = [s for s in sections if s.id != call.path_params["id"]]
        if len(kept) != len(sections):
            write_atomic(call.settings.path(kind.mapping.cfg), write_mapping_cfg(kept, kind.mapping))
    return None


def list_types(_call: Call) -> Json:
    """Mapping.pm index: the resource types."""
    return [{"name": "dir"}, {"name": "pci"}, {"name": "usb"}]


def _routes(kind: _Kind, options: dict[str, P]) -> list[tuple[str, str, Endpoint]]:
    """A subtree's routes; `options` its section options' schemas (Mapping::<type>'s propertyList)."""
    base = f"cluster/mapping/{kind.type}"
    one = f"{base}/(?P<id>[^/]+)"
    create_p = {"id": P(optional=False, verify=verify_configid), **options, "map": options["map"]}
    update_p = {
        **options,
        "map": P(type="array", items=options["map"].items),
        "delete": P(verify=verify_configid_list, list_format=True),
        "digest": P(max_length=64),
    }
    return [
        (
            "get",
            base,
            Endpoint("GET", {"check-node": P(verify=verify_node)}, functools.partial(list_mappings, kind)),
        ),
        ("create", base, Endpoint("POST", create_p, functools.partial(create_mapping, kind), True)),
        ("get", one, Endpoint("GET", {}, functools.partial(get_mapping, kind))),
        ("set", one, Endpoint("PUT", update_p, functools.partial(update_mapping, kind), True)),
        ("delete", one, Endpoint("DELETE", {}, functools.partial(delete_mapping, kind), True)),
    ]


def _permissions(kind: _Kind) -> dict[tuple[str, str], access.Permissions]:
    """Both subtrees' clauses: GET one any of Mapping.Use/Modify/Audit on /mapping/<type>/{id}, POST and
    DELETE Mapping.Modify on /mapping/<type>, PUT Mapping.Modify on /mapping/<type>/{id}."""
    acl = f"/mapping/{kind.type}"
    any_priv = tuple(
        access.Perm(f"{acl}/{{id}}", (priv,)) for priv in ("Mapping.Use", "Mapping.Modify", "Mapping.Audit")
    )
    path = f"/cluster/mapping/{kind.type}"
    return {
        ("GET", path): access.ALL_USERS,
        ("POST", path): access.Perm(acl, ("Mapping.Modify",)),
        ("GET", f"{path}/{{id}}"): access.Or(any_priv),
        ("PUT", f"{path}/{{id}}"): access.Perm(f"{acl}/{{id}}", ("Mapping.Modify",)),
        ("DELETE", f"{path}/{{id}}"): access.Perm(acl, ("Mapping.Modify",)),
    }


_MAP = P(type="array", optional=False, items=P(props=PCI_MAPPING.map_fmt))


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"cluster/mapping", Endpoint("GET", {}, list_types)),
    *_routes(
        PCI, {"map": _MAP, "description": P(max_length=4096), "mdev": BOOL, "live-migration-capable": BOOL}
    ),
    *_routes(
        DIR,
        {
            "map": P(type="array", optional=False, items=P(props=DIR_MAPPING.map_fmt)),
            "description": P(max_length=4096),
        },
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/cluster/mapping"): access.ALL_USERS,
    **_permissions(PCI),
    **_permissions(DIR),
}
