"""`GET /version` (pve-manager API2/Version.pm)."""

from __future__ import annotations

from .. import access
from ..pmxcfs import sha1
from ..rest import Call, Endpoint, Json


def get_version(call: Call) -> Json:
    s = call.settings
    return {"release": s.release, "repoid": sha1(s.version.encode())[:8], "version": s.version}


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"version", Endpoint("GET", {}, get_version)),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/version"): access.ALL_USERS,
}
