"""`GET /access/permissions` (pve-access-control API2/AccessControl.pm)."""

from __future__ import annotations

from .. import access
from ..formats import USERID_OR_TOKEN
from ..jsonschema import P
from ..rest import Call, Endpoint, Json


def get_access_permissions(call: Call) -> Json:
    """API2/AccessControl.pm permissions: `userid`'s (default: the caller's) privileges, path ->
    {privilege: propagate (1/0)}, on `path` or on every path that matters (get_effective_permissions);
    another user's (but one's own tokens') needs Sys.Audit on /access."""
    authid = call.rpcenv.user
    userid = call.params.get("userid", authid)
    owner = access.split_tokenid(userid)
    if userid != authid and (owner is None or owner[0] != authid):
        call.rpcenv.check(authid, "/access", ("Sys.Audit",))
    rpcenv = access.RpcEnv(authid, access.read_user_cfg(call.settings.root))
    if "path" in call.params:
        found = {call.params["path"]: rpcenv.permissions(userid, call.params["path"])}
    else:
        found = rpcenv.effective_permissions(userid)
    return {path: {priv: int(prop) for priv, prop in privs.items()} for path, privs in found.items()}


ROUTES: list[tuple[str, str, Endpoint]] = [
    (
        "get",
        r"access/permissions",
        Endpoint("GET", {"userid": P(pattern=USERID_OR_TOKEN), "path": P()}, get_access_permissions),
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/access/permissions"): access.ALL_USERS,
}
