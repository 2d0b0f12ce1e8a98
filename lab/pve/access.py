"""Proxmox VE's access control in the pvegpu lab: a STAND-IN for pve-access-control. This is NOT Proxmox.

Runs inside lab Proxmox nodes next to the pvesh stand-in (Debian's python3, stdlib only). It reads what
Proxmox reads, in Proxmox's formats:

- /etc/pve/user.cfg (AccessControl.pm parse_user_config): `user:<userid>:<enable>:<expire>:...`,
  `group:<name>:<users,>:<comment>:`, `token:<userid>!<name>:<expire>:<privsep>:<comment>:`,
  `role:<name>:<privs,>:`, `acl:<propagate>:<path>:<users, @groups, tokens,>:<roles,>:`; what that parser
  ignores (with a warning) is ignored here too; the built-in roles (NoAccess, Administrator, PVEAdmin,
  PVEVMAdmin, PVEAuditor, ... from `$privgroups`) always exist;
- /etc/pve/priv/token.cfg (pmxcfs's token check): `<userid>!<name> <secret>` per line.

`RpcEnv` is RPCEnvironment.pm's permission half: `permissions` (roles along the ACL path with propagation
and NoAccess, AccessControl.pm `roles`; a privilege-separated token gets the intersection with its user's
privileges, one without privilege separation its user's; root@pam everything), `check`, `check_any`,
`check_full`, `check_vm_perm` and `check_api2_permissions` (an endpoint's `permissions` clause: `Perm`,
`And`, `Or`, `ALL_USERS`, None for root@pam only). A refusal is `PermissionDenied` (pve-common
Exception.pm raise_perm_exc: `Permission check failed (<path>, <priv>)`, HTTP 403). `verify_token` is
AccessControl.pm verify_token for an `Authorization: PVEAPIToken=<tokenid>=<secret>` value.

Not modelled: pools (and their ACLs), realms' own checks (LDAP, TFA), tickets and CSRF tokens, user and
token expiry in ACL checks (verify_token checks a token's), writing user.cfg.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROOT = "root@pam"
USER_CFG = "/etc/pve/user.cfg"
TOKEN_CFG = "/etc/pve/priv/token.cfg"

# AccessControl.pm $privgroups: category -> (root, admin, user, audit) privileges.
_PRIVGROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "VM": (
        (),
        (
            "VM.Config.Disk",
            "VM.Config.CPU",
            "VM.Config.Memory",
            "VM.Config.Network",
            "VM.Config.HWType",
            "VM.Config.Options",
            "VM.Allocate",
            "VM.Clone",
            "VM.GuestAgent.Unrestricted",
            "VM.Migrate",
            "VM.Replicate",
            "VM.Snapshot",
            "VM.Snapshot.Rollback",
        ),
        (
            "VM.Config.CDROM",
            "VM.Config.Cloudinit",
            "VM.Console",
            "VM.Backup",
            "VM.GuestAgent.FileRead",
            "VM.GuestAgent.FileSystemMgmt",
            "VM.GuestAgent.FileWrite",
            "VM.PowerMgmt",
        ),
        ("VM.Audit", "VM.GuestAgent.Audit"),
    ),
    "Sys": (
        ("Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork"),
        ("Sys.Console", "Sys.Syslog"),
        (),
        ("Sys.Audit",),
    ),
    "Datastore": (
        (),
        ("Datastore.Allocate", "Datastore.AllocateTemplate"),
        ("Datastore.AllocateSpace",),
        ("Datastore.Audit",),
    ),
    "SDN": ((), ("SDN.Allocate", "SDN.Audit"), ("SDN.Use",), ("SDN.Audit",)),
    "User": (("Realm.Allocate",), ("User.Modify", "Group.Allocate", "Realm.AllocateUser"), (), ()),
    "Pool": ((), ("Pool.Allocate",), ("Pool.Audit",), ("Pool.Audit",)),
    "Mapping": ((), ("Mapping.Modify",), ("Mapping.Use",), ("Mapping.Audit",)),
}


def _special_roles() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """AccessControl.pm create_roles: the valid privileges and the built-in roles."""
    valid = {"Permissions.Modify"}
    roles: dict[str, set[str]] = {"PVEAdmin": set(), "PVEAuditor": set()}
    for category, (root, admin, user, audit) in _PRIVGROUPS.items():
        valid.update(root, admin, user, audit)
        roles.setdefault(f"PVE{category}Admin", set()).update(admin, user, audit)
        roles["PVEAdmin"].update(admin, user, audit)
        if user:
            roles.setdefault(f"PVE{category}User", set()).update(user, audit)
        roles["PVEAuditor"].update(audit)
    roles["PVEAdmin"].discard("Mapping.Modify")
    roles["PVETemplateUser"] = {"VM.Clone", "VM.Audit"}
    frozen = {name: frozenset(privs) for name, privs in roles.items()}
    return frozenset(valid), {**frozen, "NoAccess": frozenset(), "Administrator": frozenset(valid)}


VALID_PRIVS, SPECIAL_ROLES = _special_roles()

# Auth/Plugin.pm $user_regex / $realm_regex; AccessControl.pm $token_full_regex.
USER_RE = r"[^\s:/]+"
REALM_RE = r"[A-Za-z][A-Za-z0-9\.\-_]+"
USERID = re.compile(rf"({USER_RE})@({REALM_RE})")
TOKENID = re.compile(rf"(({USER_RE})@({REALM_RE}))!({REALM_RE})")
GROUP = re.compile(r"[A-Za-z0-9\.\-_]+")
ROLE = re.compile(r"[A-Za-z0-9\.\-_]+")


class PermissionDenied(Exception):  # noqa: N818 (Proxmox's name for it: a permission exception)
    """raise_perm_exc: `Permission check failed[ (<what>)]\\n`, HTTP 403."""

    code = 403

    def __init__(self, what: str | None = None) -> None:
        self.text = "Permission check failed" + (f" ({what})" if what else "") + "\n"
        super().__init__(self.text)


class AuthenticationError(Exception):
    """verify_token's die text (`invalid token value!`, `no such token ...`): pveproxy logs it and answers
    `401 Authentication failed!`."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def split_tokenid(tokenid: str) -> tuple[str, str] | None:
    """`(userid, token name)` of `user@realm!name`, None when it is not a token id."""
    match = TOKENID.fullmatch(tokenid)
    return (match.group(1), match.group(4)) if match else None


# --- user.cfg ------------------------------------------------------------------------------------


@dataclass
class Token:
    privsep: bool
    expire: int = 0


@dataclass
class User:
    enable: bool
    expire: int = 0
    tokens: dict[str, Token] = field(default_factory=dict)


@dataclass
class AclNode:
    """One ACL path component: its children and, per user / group / token, role -> propagate."""

    children: dict[str, AclNode] = field(default_factory=dict)
    users: dict[str, dict[str, bool]] = field(default_factory=dict)
    groups: dict[str, dict[str, bool]] = field(default_factory=dict)
    tokens: dict[str, dict[str, bool]] = field(default_factory=dict)


@dataclass
class UserConfig:
    users: dict[str, User] = field(default_factory=dict)
    groups: dict[str, set[str]] = field(default_factory=dict)
    roles: dict[str, frozenset[str]] = field(default_factory=dict)
    acl_root: AclNode = field(default_factory=AclNode)
    warnings: list[str] = field(default_factory=list)


def _split_list(text: str) -> list[str]:
    """PVE::Tools::split_list: separated by commas, semicolons or white space."""
    return [item for item in re.split(r"[,;\s]+", text) if item]


def normalize_path(path: str) -> str | None:
    """AccessControl.pm normalize_path: `//` collapsed, no trailing `/`, a leading `/`."""
    if not path:
        return None
    path = re.sub(r"/+", "/", path)
    path = path[:-1] if path.endswith("/") else path
    path = path or "/"
    path = path if path.startswith("/") else f"/{path}"
    return path if re.fullmatch(r"[A-Za-z0-9._/-]+", path) else None


def find_acl_node(root: AclNode, path: str) -> AclNode:
    """AccessControl.pm find_acl_tree_node: the node of `path`, created with its parents."""
    node = root
    for part in (p for p in path.split("/") if p):
        node = node.children.setdefault(part, AclNode())
    return node


def _force_defaults(cfg: UserConfig) -> None:
    cfg.roles.update(SPECIAL_ROLES)
    cfg.users.setdefault(ROOT, User(enable=True))


def parse_user_cfg(text: str) -> UserConfig:  # noqa: PLR0912 (one branch per line type, as the original)
    """AccessControl.pm parse_user_config (users, groups, roles, tokens, ACLs; pools are not modelled)."""
    cfg = UserConfig()
    _force_defaults(cfg)
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        kind, *data = [d.strip() for d in line.split(":")]
        data += [""] * 8
        if kind == "user":
            userid, enable, expire = data[0], data[1], data[2] or "0"
            if not USERID.fullmatch(userid):
                cfg.warnings.append(f"user config - ignore user '{userid}' - invalid user name")
            elif not expire.isdigit():
                cfg.warnings.append(
                    f"user config - ignore user '{userid}' - (illegal characters in expire '{expire}')"
                )
            else:
                cfg.users[userid] = User(enable=enable not in ("", "0"), expire=int(expire))
        elif kind == "group":
            name, members = data[0], data[1]
            if not GROUP.fullmatch(name):
                cfg.warnings.append(f"user config - ignore group '{name}' - invalid characters in group name")
                continue
            cfg.groups.setdefault(name, set()).update(m for m in _split_list(members) if USERID.fullmatch(m))
        elif kind == "role":
            name, privs = data[0], data[1]
            if not ROLE.fullmatch(name):
                cfg.warnings.append(f"user config - ignore role '{name}' - invalid characters in role name")
                continue
            valid = {p for p in _split_list(privs) if p in VALID_PRIVS}
            cfg.roles[name] = cfg.roles.get(name, frozenset()) | valid
        elif kind == "acl":
            _parse_acl(cfg, data[0], data[1], data[2], data[3])
        elif kind == "token":
            _parse_token(cfg, data[0], data[1] or "0", data[2])
        else:
            cfg.warnings.append(f"user config - ignore config line: {line}")
    _force_defaults(cfg)
    return cfg


def _parse_token(cfg: UserConfig, tokenid: str, expire: str, privsep: str) -> None:
    split = split_tokenid(tokenid)
    if split is None:
        cfg.warnings.append(f"user config - ignore invalid tokenid '{tokenid}'")
    elif not expire.isdigit():
        cfg.warnings.append(
            f"user config - ignore token '{tokenid}' - (illegal characters in expire '{expire}')"
        )
    elif split[0] not in cfg.users:
        cfg.warnings.append(f"user config - ignore token '{tokenid}' - user does not exist")
    else:
        cfg.users[split[0]].tokens[split[1]] = Token(privsep=privsep not in ("", "0"), expire=int(expire))


def _parse_acl(cfg: UserConfig, propagate_text: str, path_text: str, members: str, role_list: str) -> None:
    propagate = propagate_text not in ("", "0")
    path = normalize_path(path_text)
    if path is None:
        cfg.warnings.append(f"user config - ignore invalid path in acl '{path_text}'")
        return
    for role in _split_list(role_list):
        if not ROLE.fullmatch(role) or role not in cfg.roles:
            cfg.warnings.append(f"user config - ignore invalid acl role '{role}'")
            continue
        for member in _split_list(members):
            node = find_acl_node(cfg.acl_root, path)
            if member.startswith("@") and GROUP.fullmatch(member[1:]):
                node.groups.setdefault(member[1:], {})[role] = propagate
            elif USERID.fullmatch(member):
                node.users.setdefault(member, {})[role] = propagate
            elif (split := split_tokenid(member)) and split[1] in cfg.users.get(split[0], User(False)).tokens:
                node.tokens.setdefault(member, {})[role] = propagate
            else:
                cfg.warnings.append(f"user config - invalid user/group '{member}' in acl")


def read_user_cfg(root: Path) -> UserConfig:
    """The node's user.cfg (`root`: the node's state root), parsed; the defaults when there is none."""
    cfg_file = root / USER_CFG.lstrip("/")
    return parse_user_cfg(cfg_file.read_text() if cfg_file.is_file() else "")


def parse_token_cfg(text: str) -> dict[str, str]:
    """/etc/pve/priv/token.cfg: token id -> secret."""
    secrets = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            secrets[parts[0]] = parts[1]
    return secrets


def roles(cfg: UserConfig, user: str, path: str) -> dict[str, bool]:
    """AccessControl.pm roles: role -> propagate for `user` (or a token) on `path`. Along the path, a token's
    own ACL overrides a user's, which overrides its groups'; each level with a matching entry replaces the
    roles so far (only propagating ones count above the final level); NoAccess wins alone."""
    if user == ROOT:
        return {"Administrator": True}
    split = split_tokenid(user)
    if split is not None:
        owner = cfg.users.get(split[0])
        token = owner.tokens.get(split[1]) if owner else None
        if token is None:
            return {}
        if not token.privsep:
            return roles(cfg, split[0], path)
    parts = [""] if path == "/" else path.split("/")
    found: dict[str, bool] = {}
    node: AclNode | None = cfg.acl_root
    for index, part in enumerate(parts):
        if part != "":
            node = node.children.get(part) if node else None
        if node is None:
            break
        found = _level_roles(cfg, node, user, final=index == len(parts) - 1) or found
    return {"NoAccess": found["NoAccess"]} if "NoAccess" in found else found


def _level_roles(cfg: UserConfig, node: AclNode, user: str, final: bool) -> dict[str, bool]:
    """The roles one ACL level gives `user` ({} for none): its token entry, else its user entry, else its
    groups' (above the final level only propagating ones)."""
    for entries in (node.tokens.get(user), node.users.get(user)):
        own = {role: prop for role, prop in (entries or {}).items() if final or prop}
        if own:
            return own
    inherited: dict[str, bool] = {}
    for group, group_roles in node.groups.items():
        if user in cfg.groups.get(group, set()):
            inherited.update({role: prop for role, prop in group_roles.items() if final or prop})
    return inherited


# --- permission checks (RPCEnvironment.pm) --------------------------------------------------------------


@dataclass(frozen=True)
class Perm:
    """`['perm', path, [privs], any => 1]`: `path` may hold `{param}` templates."""

    path: str
    privs: tuple[str, ...]
    any: bool = False


@dataclass(frozen=True)
class And:
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Or:
    checks: tuple[Check, ...]


Check = Perm | And | Or
ALL_USERS: Literal["all"] = "all"  # `user => 'all'`: any authenticated user (checks inside, if any)
Permissions = Check | Literal["all"] | None  # None: no clause, root@pam only


@dataclass
class RpcEnv:
    """Who calls (`user`: `root@pam`, `user@realm` or a token `user@realm!name`) and the access config."""

    user: str = ROOT
    config: UserConfig = field(default_factory=UserConfig)
    _cache: dict[tuple[str, str], dict[str, bool]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, root: Path, user: str) -> RpcEnv:
        """`user`'s environment on the node whose state lives under `root` (root@pam reads nothing)."""
        if user == ROOT:
            return cls(ROOT)
        return cls(user, read_user_cfg(root))

    @property
    def is_root(self) -> bool:
        return self.user == ROOT

    def permissions(self, user: str, path: str) -> dict[str, bool]:
        """RPCEnvironment.pm permissions: privilege -> propagate of `user` on `path`."""
        if user == ROOT:
            return dict.fromkeys(sorted(VALID_PRIVS), True)
        key = (user, path)
        if key not in self._cache:
            self._cache[key] = self._compile(user, path)
        return self._cache[key]

    def _compile(self, user: str, path: str) -> dict[str, bool]:
        split = split_tokenid(user)
        if split is not None:
            owner = self.config.users.get(split[0])
            token = owner.tokens.get(split[1]) if owner else None
            if token is None:
                return {}
            user_privs = self.permissions(split[0], path)
            if not token.privsep:
                return user_privs
        elif not USERID.fullmatch(user):
            return {}
        privs: dict[str, bool] = {}
        for role, propagate in roles(self.config, user, path).items():
            for priv in self.config.roles.get(role, frozenset()):
                privs[priv] = privs.get(priv, False) or propagate
        if split is not None and split[0] != ROOT:
            # intersect the token's privileges with its owner's, both propagation flags combined
            privs = {p: user_privs[p] and prop for p, prop in privs.items() if p in user_privs}
        return privs

    def check(self, user: str, path: str, privs: tuple[str, ...], noerr: bool = False) -> bool:
        """RPCEnvironment.pm check: every privilege in `privs` (the first one missing is named)."""
        perm = self.permissions(user, path)
        for priv in privs:
            if priv not in perm:
                if noerr:
                    return False
                raise PermissionDenied(f"{path}, {priv}")
        return True

    def check_any(self, user: str, path: str, privs: tuple[str, ...], noerr: bool = False) -> bool:
        """RPCEnvironment.pm check_any: one of `privs` (all named, `|`-joined, when none is held)."""
        perm = self.permissions(user, path)
        if any(priv in perm for priv in privs):
            return True
        if noerr:
            return False
        raise PermissionDenied(f"{path}, {'|'.join(privs)}")

    def check_full(
        self, user: str, path: str, privs: tuple[str, ...], any_of: bool = False, noerr: bool = False
    ) -> bool:
        return (self.check_any if any_of else self.check)(user, path, privs, noerr)

    def check_vm_perm(
        self, user: str, vmid: str, privs: tuple[str, ...], any_of: bool = False, noerr: bool = False
    ) -> bool:
        """RPCEnvironment.pm check_vm_perm on `/vms/<vmid>` (pools are not modelled)."""
        return self.check_full(user, f"/vms/{vmid}", privs, any_of, noerr)

    def check_api2_permissions(self, permissions: Permissions, params: dict[str, object]) -> None:
        """RPCEnvironment.pm check_api2_permissions for the calling user, before the parameters are
        verified (pve-manager HTTPServer.pm rest_handler): root@pam passes; no clause is root's only."""
        if self.is_root:
            return
        if permissions is None:
            raise PermissionDenied("user != root@pam")
        if permissions == ALL_USERS:
            return
        self._exec_check(permissions, params, noerr=False)

    def _exec_check(self, check: Check, params: dict[str, object], noerr: bool) -> bool:
        """RPCEnvironment.pm exec_api2_perm_check: `and` checks each (fatal), `or` any (a bare
        `Permission check failed` when none), `perm` the path with `{param}`s replaced."""
        if isinstance(check, And):
            for sub in check.checks:
                self._exec_check(sub, params, noerr=False)
            return True
        if isinstance(check, Or):
            if any(self._exec_check(sub, params, noerr=True) for sub in check.checks):
                return True
            if noerr:
                return False
            raise PermissionDenied()
        path = re.sub(r"\{(\w+)\}", lambda m: str(params.get(m.group(1), "")), check.path)
        normalized = normalize_path(path) or path
        return self.check_full(self.user, normalized, check.privs, check.any, noerr)

    def effective_permissions(self, user: str) -> dict[str, dict[str, bool]]:
        """RPCEnvironment.pm get_effective_permissions: per path (the top-level ones and every ACL path),
        the privileges `user` has there; paths without any are left out."""
        paths = {"/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms"}

        def walk(node: AclNode, path: str) -> None:
            paths.add(path)
            for name, child in node.children.items():
                walk(child, f"{path.rstrip('/')}/{name}")

        walk(self.config.acl_root, "/")
        found = {path: self.permissions(user, path) for path in sorted(paths)}
        return {path: privs for path, privs in found.items() if privs}


# --- API tokens ----------------------------------------------------------------------------------------


def verify_token(root: Path, api_token: str, now: float | None = None) -> str:
    """AccessControl.pm verify_token for `<tokenid>=<secret>`: the token id, or AuthenticationError with
    Proxmox's text (the user must exist and be enabled, the token exist and not be expired, the secret
    match token.cfg's)."""
    match = re.fullmatch(r"(.*)=(.*)", api_token, re.DOTALL)
    if not api_token:
        raise AuthenticationError("no API token specified\n")
    if match is None:
        raise AuthenticationError("no tokenid specified\n")
    tokenid, secret = match.groups()
    split = split_tokenid(tokenid)
    if split is None:
        raise AuthenticationError(
            f"'{tokenid}' is not a valid token ID - not able to split into user and token parts\n"
        )
    userid, name = split
    user = read_user_cfg(root).users.get(userid)
    if user is None:
        raise AuthenticationError(f"no such user ('{userid}')\n")
    current = time.time() if now is None else now
    if not user.enable:
        raise AuthenticationError(f"user '{userid}' is disabled\n")
    if user.expire and user.expire < current:
        raise AuthenticationError(f"user '{userid}' access expired\n")
    token = user.tokens.get(name)
    if token is None:
        raise AuthenticationError(f"no such token '{name}' for user '{userid}'\n")
    if token.expire and token.expire < current:
        raise AuthenticationError(f"token '{name}' access expired\n")
    secrets_file = root / TOKEN_CFG.lstrip("/")
    secrets = parse_token_cfg(secrets_file.read_text() if secrets_file.is_file() else "")
    if secrets.get(tokenid) != secret:
        raise AuthenticationError("invalid token value!\n")
    return tokenid
