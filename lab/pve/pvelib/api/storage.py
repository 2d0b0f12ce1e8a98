"""`/storage[/{storage}]` (pve-storage API2/Storage/Config.pm)."""

from __future__ import annotations

import re
from typing import Any

from .. import access
from ..errors import DieError
from ..formats import BOOL, verify_content_list
from ..jsonschema import P
from ..pmxcfs import locked, write_atomic
from ..rest import Call, Endpoint, Json
from ..storage import (
    BOOLEAN_OPTIONS,
    REQUIRED_OPTIONS,
    STORAGE_CFG,
    STORAGE_TYPES,
    Storage,
    storage_config,
    storage_state,
    write_storage_cfg,
)
from .nodes_storage import decoded_content


def _storage_json(storage: Storage, digest: str) -> dict[str, Any]:
    """Config.pm's $api_storage_config: the options (booleans as numbers) plus storage, type, digest."""
    result: dict[str, Any] = {k: int(v) if k in BOOLEAN_OPTIONS else v for k, v in storage.options.items()}
    result.update(storage=storage.id, type=storage.type, digest=digest, content=",".join(storage.content))
    return result


def list_storages(call: Call) -> Json:
    storages, digest = storage_state(call.settings)
    wanted = call.params.get("type")
    rpcenv = call.rpcenv  # Config.pm index: only storages with Datastore.Audit or AllocateSpace
    privs = ("Datastore.Audit", "Datastore.AllocateSpace")
    return [
        _storage_json(s, digest)
        for s in storages
        if wanted in (None, s.type) and rpcenv.check_any(rpcenv.user, f"/storage/{s.id}", privs, noerr=True)
    ]


def get_storage(call: Call) -> Json:
    digest = storage_state(call.settings)[1]
    return _storage_json(storage_config(call.settings, call.path_params["storage"]), digest)


def update_storage(call: Call) -> Json:
    """Config.pm `update` under lock_storage_config: every error gets `update storage failed: `; a content
    type the plugin does not support is dropped with a warning (stderr), as Plugin::decode_value does."""
    prefix = "update storage failed: "
    storage_id = call.path_params["storage"]
    with locked(call.settings):
        storages, digest = storage_state(call.settings)
        try:
            if call.params.get("digest") and call.params["digest"] != digest:
                raise DieError("detected modified configuration - file changed by other user? Try again.\n")
            storage = next((s for s in storages if s.id == storage_id), None)
            if storage is None:
                raise DieError(f"storage '{storage_id}' does not exist\n")
            changes = {k: v for k, v in call.params.items() if k not in ("digest", "delete")}
            if "content" in changes:
                changes["content"] = decoded_content(storage, changes["content"])
            if "disable" in changes:
                changes["disable"] = str(changes["disable"])
            deletes = [k for k in re.split(r"[,;\s]+", call.params.get("delete", "")) if k]
            for key in deletes:
                if key not in (
                    "content",
                    "disable",
                    "nodes",
                    "shared",
                    "prune-backups",
                    *REQUIRED_OPTIONS.get(storage.type, ()),
                ):
                    raise DieError(f"no such option '{key}'\n")
                if key in REQUIRED_OPTIONS.get(storage.type, ()):
                    raise DieError(f"unable to delete required option '{key}'\n")
                if key in changes:
                    raise DieError(f"cannot set and delete property '{key}' at the same time!\n")
        except DieError as error:
            raise DieError(prefix + error.text) from None
        for key in deletes:
            storage.options.pop(key, None)
        storage.options.update(changes)
        write_atomic(call.settings.path(STORAGE_CFG), write_storage_cfg(storages))
    return {"storage": storage.id, "type": storage.type}


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"storage", Endpoint("GET", {"type": P(enum=STORAGE_TYPES)}, list_storages)),
    ("get", r"storage/(?P<storage>[^/]+)", Endpoint("GET", {}, get_storage)),
    (
        "set",
        r"storage/(?P<storage>[^/]+)",
        Endpoint(
            "PUT",
            {
                "content": P(verify=verify_content_list, list_format=True),
                "delete": P(list_format=True),
                "digest": P(max_length=64),
                "disable": BOOL,
            },
            update_storage,
        ),
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/storage"): access.ALL_USERS,
    ("GET", "/storage/{storage}"): access.Perm("/storage/{storage}", ("Datastore.Allocate",)),
    ("PUT", "/storage/{storage}"): access.Perm("/storage", ("Datastore.Allocate",)),
}
