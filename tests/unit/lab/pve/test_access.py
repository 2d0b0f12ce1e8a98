"""The lab's access-control stand-in (lab/pve/access.py) and the pvesh stand-in's permission checks when an
API token calls (pvelib.api.call_api, as the pveproxy stand-in calls it): ACL paths, propagation, NoAccess,
privilege-separated tokens, each root-only key refused with qemu-server's text on create, update and delete,
`host=` passthrough, Mapping.Use, skiplock, Sys.Audit and other users' tasks, `GET /access/permissions`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.pve import access, api_setup
from lab.pve.pvelib.api import PERMISSIONS, ROUTES, call_api, route_template
from lab.pve.pvelib.errors import DieError, ParamError
from lab.pve.pvelib.settings import Settings
from pvegpu.models.pve_privileges import PVE_PRIVILEGES, privilege_names

TOKEN = "pvegpu@pve!deploy"
NODE = "pve1"
HOOK = "local:snippets/pvegpu-hook.pl"


def env(cfg: str, user: str) -> access.RpcEnv:
    return access.RpcEnv(user, access.parse_user_cfg(cfg))


# --- ACLs ---------------------------------------------------------------------------------------------

ACLS = """\
user:alice@pve:1:0::::::
user:bob@pve:1:0::::::
token:alice@pve!sep:0:1::
token:alice@pve!full:0:0::
group:ops:bob@pve::
role:Watch:VM.Audit:
role:Boot:VM.PowerMgmt,VM.Audit:

acl:1:/vms:@ops:Watch:
acl:0:/vms:bob@pve:Boot:
acl:1:/vms/200:alice@pve:NoAccess:
acl:1:/:alice@pve:PVEVMAdmin:
acl:1:/vms:alice@pve!sep:Boot:
acl:1:/storage:alice@pve!sep:PVEDatastoreAdmin:
"""


def test_acl_user_entry_overrides_its_groups_and_a_non_propagating_one_stops_at_its_path() -> None:
    bob = env(ACLS, "bob@pve")
    assert sorted(bob.permissions("bob@pve", "/vms")) == ["VM.Audit", "VM.PowerMgmt"]
    # /vms/100: bob's own entry does not propagate, so his group's (propagating) one applies
    assert bob.permissions("bob@pve", "/vms/100") == {"VM.Audit": True}
    assert bob.permissions("bob@pve", "/") == {}


def test_acl_noaccess_below_a_propagating_grant_removes_everything() -> None:
    alice = env(ACLS, "alice@pve")
    assert "VM.Allocate" in alice.permissions("alice@pve", "/vms/100")
    assert alice.permissions("alice@pve", "/vms/200") == {}
    assert access.roles(alice.config, "alice@pve", "/vms/200/x") == {"NoAccess": True}


def test_acl_privsep_token_gets_the_intersection_with_its_user_and_a_full_token_its_user() -> None:
    rpc = env(ACLS, "alice@pve!sep")
    assert rpc.permissions("alice@pve!sep", "/vms/100") == {"VM.Audit": True, "VM.PowerMgmt": True}
    # the token has Datastore privileges on /storage, its user none: the intersection is empty
    assert rpc.permissions("alice@pve!sep", "/storage/local") == {}
    assert rpc.permissions("alice@pve!full", "/vms/100") == rpc.permissions("alice@pve", "/vms/100")
    assert rpc.permissions("alice@pve!nosuch", "/vms/100") == {}


def test_acl_root_has_every_privilege() -> None:
    root = access.RpcEnv()
    assert sorted(root.permissions("root@pam", "/anything")) == sorted(access.VALID_PRIVS)
    assert "Permissions.Modify" in access.VALID_PRIVS
    assert "Mapping.Modify" not in access.SPECIAL_ROLES["PVEAdmin"]


def test_acl_check_texts_name_the_path_and_the_privileges() -> None:
    rpc = env(ACLS, "bob@pve")
    with pytest.raises(access.PermissionDenied) as one:
        rpc.check("bob@pve", "/vms/100", ("VM.Audit", "VM.Allocate"))
    assert (one.value.code, one.value.text) == (403, "Permission check failed (/vms/100, VM.Allocate)\n")
    with pytest.raises(access.PermissionDenied) as any_of:
        rpc.check_any("bob@pve", "/storage/local", ("Datastore.Audit", "Datastore.AllocateSpace"))
    expected = "Permission check failed (/storage/local, Datastore.Audit|Datastore.AllocateSpace)\n"
    assert any_of.value.text == expected
    clause = access.Or((access.Perm("/", ("Sys.Audit",)), access.Perm("/nodes/{node}", ("Sys.Modify",))))
    with pytest.raises(access.PermissionDenied) as bare:
        rpc.check_api2_permissions(clause, {"node": NODE})
    assert bare.value.text == "Permission check failed\n"
    with pytest.raises(access.PermissionDenied) as undefined:
        rpc.check_api2_permissions(None, {})
    assert undefined.value.text == "Permission check failed (user != root@pam)\n"


def test_user_cfg_lines_the_parser_ignores_are_warned_about() -> None:
    cfg = access.parse_user_cfg(
        "user:nouser:1:0:::\ntoken:ghost@pve!tk:0:1::\nrole:R:VM.Audit,No.Such:\nacl:1:/:x@pve:Missing:\nfoo:bar\n"
    )
    assert cfg.roles["R"] == frozenset({"VM.Audit"})
    assert cfg.warnings == [
        "user config - ignore user 'nouser' - invalid user name",
        "user config - ignore token 'ghost@pve!tk' - user does not exist",
        "user config - ignore invalid acl role 'Missing'",
        "user config - ignore config line: foo:bar",
    ]


def test_verify_token_texts(tmp_path: Path) -> None:
    api_setup.write_access(tmp_path, "s3cret")
    assert access.verify_token(tmp_path, f"{TOKEN}=s3cret") == TOKEN
    cases = {
        f"{TOKEN}=wrong": "invalid token value!\n",
        "pvegpu@pve!other=s3cret": "no such token 'other' for user 'pvegpu@pve'\n",
        "nobody@pve!deploy=x": "no such user ('nobody@pve')\n",
        "justtext": "no tokenid specified\n",
    }
    for value, text in cases.items():
        with pytest.raises(access.AuthenticationError) as refused:
            access.verify_token(tmp_path, value)
        assert refused.value.text == text


def test_seeded_role_holds_exactly_pvegpus_privileges() -> None:
    cfg = access.parse_user_cfg(api_setup.user_cfg())
    assert cfg.warnings == []
    assert cfg.roles["PVEGPU"] == frozenset(p.name for p in PVE_PRIVILEGES)
    assert set(privilege_names()) <= access.VALID_PRIVS
    rpc = access.RpcEnv(TOKEN, cfg)
    assert sorted(rpc.permissions(TOKEN, "/vms/100")) == list(privilege_names())


# --- the pvesh stand-in's handlers, called as the token ----------------------------------------------------


@dataclass
class Node:
    settings: Settings

    @property
    def root(self) -> Path:
        return self.settings.root

    def call(self, user: str, cmd: str, api_path: str, **raw: Any) -> Any:
        rpcenv = access.RpcEnv.load(self.root, user)
        params = {key.replace("_", "-"): value for key, value in raw.items()}
        return call_api(self.settings, rpcenv, cmd, api_path, params)

    def conf(self, vmid: int, text: str) -> None:
        path = self.root / f"etc/pve/qemu-server/{vmid}.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    settings = Settings(NODE, tmp_path / "sys", tmp_path / "root", None, 1.0, "9.0.3", "9.0")
    api_setup.write_access(settings.root, "s3cret")
    hook = settings.root / "var/lib/vz/snippets/pvegpu-hook.pl"
    hook.parent.mkdir(parents=True)
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    return Node(settings)


ROOT_ONLY = {
    "hookscript": HOOK,
    "args": "-set device.hostpci0.x-nv-gpudirect-clique=0",
    "hugepages": "1024",
    "affinity": "0-7",
    "lock": "backup",
}
CONFIG = "/nodes/pve1/qemu/100/config"


@pytest.mark.parametrize("key", sorted(ROOT_ONLY))
def test_error_token_create_with_a_root_only_key(node: Node, key: str) -> None:
    with pytest.raises(DieError) as refused:
        node.call(TOKEN, "create", "/nodes/pve1/qemu", vmid="100", name="vm", **{key: ROOT_ONLY[key]})
    assert refused.value.text == f"only root can set '{key}' config\n"
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()
    assert not (node.root / "var/log/pvegpu-lab/api-writes.log").exists()


@pytest.mark.parametrize("key", sorted(ROOT_ONLY))
def test_error_token_update_with_a_root_only_key(node: Node, key: str) -> None:
    node.conf(100, "name: vm\n")
    with pytest.raises(DieError) as refused:
        node.call(TOKEN, "set", CONFIG, **{key: ROOT_ONLY[key]})
    assert refused.value.text == f"only root can set '{key}' config\n"
    assert (node.root / "etc/pve/qemu-server/100.conf").read_text() == "name: vm\n"
    assert not (node.root / "var/log/pvegpu-lab/api-writes.log").exists()


@pytest.mark.parametrize("key", sorted(ROOT_ONLY))
def test_error_token_delete_of_a_root_only_key(node: Node, key: str) -> None:
    node.conf(100, f"name: vm\n{key}: {ROOT_ONLY[key]}\n")
    with pytest.raises(DieError) as refused:
        node.call(TOKEN, "set", CONFIG, delete=key)
    assert refused.value.text == f"only root can set '{key}' config\n"


def test_root_sets_and_deletes_every_root_only_key_and_the_log_names_root(node: Node, capsys: Any) -> None:
    node.conf(100, "name: vm\n")
    keys = {k: v for k, v in ROOT_ONLY.items() if k != "lock"}
    node.call("root@pam", "set", CONFIG, **keys)
    node.call("root@pam", "set", CONFIG, delete="args")
    node.call(TOKEN, "set", CONFIG, cores="4")
    assert (node.root / "var/log/pvegpu-lab/api-writes.log").read_text() == (
        "root@pam PUT /nodes/pve1/qemu/100/config affinity,args,hookscript,hugepages\n"
        "root@pam PUT /nodes/pve1/qemu/100/config -args\n"
        f"{TOKEN} PUT /nodes/pve1/qemu/100/config cores\n"
    )
    capsys.readouterr()


def test_error_token_host_passthrough_on_create_update_and_delete(node: Node) -> None:
    text = "only root can set 'hostpci0' config for non-mapped devices\n"
    with pytest.raises(DieError) as create:
        node.call(TOKEN, "create", "/nodes/pve1/qemu", vmid="101", hostpci0="0000:01:00.0,pcie=1")
    node.conf(100, "machine: q35\n")
    with pytest.raises(DieError) as update:
        node.call(TOKEN, "set", CONFIG, hostpci0="host=0000:01:00.0")
    node.conf(100, "hostpci0: 0000:01:00.0\nmachine: q35\n")
    with pytest.raises(DieError) as delete:
        node.call(TOKEN, "set", CONFIG, delete="hostpci0")
    with pytest.raises(DieError) as replace:  # a mapped device replacing a raw one: the old one counts
        node.call(TOKEN, "set", CONFIG, hostpci0="mapping=gpu0")
    assert [e.value.text for e in (create, update, delete, replace)] == [text] * 4


def test_mapping_use_is_needed_for_a_mapped_device(node: Node, capsys: Any) -> None:
    cfg = node.root / "etc/pve/user.cfg"
    cfg.write_text(cfg.read_text().replace("Mapping.Use,", ""))
    with pytest.raises(access.PermissionDenied) as refused:
        node.call(TOKEN, "create", "/nodes/pve1/qemu", vmid="100", hostpci0="mapping=gpu0,pcie=1")
    assert refused.value.text == "Permission check failed (/mapping/pci/gpu0, Mapping.Use)\n"
    cfg.write_text(api_setup.user_cfg())
    upid = node.call(TOKEN, "create", "/nodes/pve1/qemu", vmid="100", hostpci0="mapping=gpu0,pcie=1")
    assert upid.endswith(f":qmcreate:100:{TOKEN}:")
    capsys.readouterr()


def test_error_token_skiplock_on_unlock_start_and_destroy(node: Node) -> None:
    node.conf(100, "lock: create\n")
    calls = [
        ("set", CONFIG, {"delete": "lock", "skiplock": "1"}),
        ("create", "/nodes/pve1/qemu/100/status/start", {"skiplock": "1"}),
        ("delete", "/nodes/pve1/qemu/100", {"skiplock": "1"}),
    ]
    for cmd, path, raw in calls:
        with pytest.raises(ParamError) as refused:
            node.call(TOKEN, cmd, path, **raw)
        assert refused.value.errors == {"skiplock": "Only root may use this option."}


def test_privsep_token_is_refused_what_its_user_lacks(node: Node) -> None:
    cfg = node.root / "etc/pve/user.cfg"
    lines = cfg.read_text().replace(f"acl:1:/:pvegpu@pve,{TOKEN}:PVEGPU:", f"acl:1:/:{TOKEN}:PVEGPU:")
    cfg.write_text(lines + "acl:1:/:pvegpu@pve:PVEAuditor:\n")
    with pytest.raises(access.PermissionDenied) as refused:  # create_vm: raise_perm_exc() without a text
        node.call(TOKEN, "create", "/nodes/pve1/qemu", vmid="100", name="vm")
    assert refused.value.text == "Permission check failed\n"
    node.conf(100, "name: vm\n")
    assert node.call(TOKEN, "get", CONFIG)["name"] == "vm"  # VM.Audit: both have it
    with pytest.raises(access.PermissionDenied) as start:
        node.call(TOKEN, "create", "/nodes/pve1/qemu/100/status/start")
    assert start.value.text == "Permission check failed (/vms/100, VM.PowerMgmt)\n"


def test_tasks_of_other_users_need_sys_audit(node: Node, capsys: Any) -> None:
    root_upid = node.call("root@pam", "create", "/nodes/pve1/qemu", vmid="100", name="a")
    token_upid = node.call(TOKEN, "create", "/nodes/pve1/qemu", vmid="101", name="b")
    capsys.readouterr()
    listed = {task["upid"]: task for task in node.call(TOKEN, "get", "/nodes/pve1/tasks")}
    assert set(listed) == {root_upid, token_upid}  # PVEGPU holds Sys.Audit
    assert (listed[token_upid]["user"], listed[token_upid]["tokenid"]) == ("pvegpu@pve", "deploy")
    status = node.call(TOKEN, "get", f"/nodes/pve1/tasks/{token_upid}/status")
    assert (status["user"], status["tokenid"], status["exitstatus"]) == ("pvegpu@pve", "deploy", "OK")

    cfg = node.root / "etc/pve/user.cfg"
    cfg.write_text(cfg.read_text().replace("Sys.Audit,", ""))
    assert [t["upid"] for t in node.call(TOKEN, "get", "/nodes/pve1/tasks")] == [token_upid]
    with pytest.raises(access.PermissionDenied) as refused:
        node.call(TOKEN, "get", f"/nodes/pve1/tasks/{root_upid}/status")
    assert refused.value.text == "Permission check failed (/nodes/pve1, Sys.Audit)\n"
    # the token's user sees its tokens' tasks
    assert [t["upid"] for t in node.call("pvegpu@pve", "get", "/nodes/pve1/tasks")] == [token_upid]


def test_access_permissions_answers_the_tokens_privileges(node: Node) -> None:
    answer = node.call(TOKEN, "get", "/access/permissions", path="/vms/100")
    assert answer == {"/vms/100": dict.fromkeys(privilege_names(), 1)}
    tree = node.call(TOKEN, "get", "/access/permissions")
    assert sorted(tree) == ["/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms"]
    assert node.call(TOKEN, "get", "/access/permissions", userid="root@pam", path="/")["/"]["Sys.Audit"] == 1
    cfg = node.root / "etc/pve/user.cfg"
    cfg.write_text(cfg.read_text().replace("Sys.Audit,", ""))
    with pytest.raises(access.PermissionDenied) as refused:  # another user's: Sys.Audit on /access
        node.call(TOKEN, "get", "/access/permissions", userid="root@pam")
    assert refused.value.text == "Permission check failed (/access, Sys.Audit)\n"
    own = node.call("pvegpu@pve", "get", "/access/permissions", userid=TOKEN, path="/")
    assert own == {"/": dict.fromkeys(sorted(set(privilege_names()) - {"Sys.Audit"}), 1)}


def test_storage_and_mapping_lists_are_filtered(node: Node) -> None:
    (node.root / "etc/pve/mapping").mkdir(parents=True)
    (node.root / "etc/pve/mapping/pci.cfg").write_text(
        "gpu0\n\tmap id=10de:2684,node=pve1,path=0000:01:00.0\n"
    )
    assert [m["id"] for m in node.call(TOKEN, "get", "/cluster/mapping/pci")] == ["gpu0"]
    assert [s["storage"] for s in node.call(TOKEN, "get", "/storage")] == ["local", "local-lvm"]
    cfg = node.root / "etc/pve/user.cfg"
    cfg.write_text(
        cfg.read_text()
        + f"acl:1:/mapping/pci/gpu0:{TOKEN}:NoAccess:\nacl:1:/storage/local:{TOKEN}:NoAccess:\n"
    )
    assert node.call(TOKEN, "get", "/cluster/mapping/pci") == []
    assert [s["storage"] for s in node.call(TOKEN, "get", "/storage")] == ["local-lvm"]
    with pytest.raises(access.PermissionDenied) as refused:
        node.call(TOKEN, "get", "/storage/local")
    assert refused.value.text == "Permission check failed (/storage/local, Datastore.Allocate)\n"


def test_lxc_device_passthrough_is_root_only(node: Node) -> None:
    with pytest.raises(access.PermissionDenied) as refused:
        node.call(
            TOKEN,
            "create",
            "/nodes/pve1/lxc",
            vmid="200",
            ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
            dev0="/dev/nvidia0",
        )
    assert refused.value.text == (
        "Permission check failed (configuring device passthrough is only allowed for root@pam)\n"
    )


def test_every_route_has_its_permissions_clause() -> None:
    routes = {(endpoint.method, route_template(pattern)) for _, pattern, endpoint in ROUTES}
    assert len(routes) == len(ROUTES)
    assert routes - set(PERMISSIONS) == set()
    assert ("PUT", "/nodes/{node}/qemu/{vmid}/config") in routes
