"""The pvesh stand-in's reads of what holds a guest, called as the API token (call_api): `GET
/cluster/ha/resources` (pve-ha-manager API2/HA/Resources.pm: Sys.Audit on `/`), `GET /cluster/replication`
(pve-manager API2/ReplicationConfig.pm: the jobs of guests with VM.Audit) and `GET /cluster/backup`
(API2/Backup.pm: Sys.Audit on `/`, jobs.cfg's vzdump jobs), and pvegpu's client reading their answers."""

from __future__ import annotations

import pytest

from lab.pve import access, api_setup
from lab.pve.pvelib.rest import CMDS
from pvegpu.models.pve import BackupJob, ReplicationJob
from pvegpu.pve.client import PveClient
from pvegpu.pve.transport import Method, Params
from tests.unit.lab.pve.test_access import TOKEN, Node, node  # noqa: F401

REPLICATION_CFG = "local: 101-0\n\ttarget pve2\n\nlocal: 100-0\n\ttarget pve2\n\tschedule */15\n\tdisable 1\n"
JOBS_CFG = (
    "vzdump: backup-5f3c2a1b-7d4e\n\tschedule 21:00\n\tall 1\n\tenabled 1\n\texclude 101\n\tmode snapshot\n"
    "\tprune-backups keep-last=3\n\tstorage local\n\n"
    "realm-sync: sync-ldap\n\tschedule daily\n\trealm ldap\n\n"
    "vzdump: listed\n\tschedule sat 02:00\n\tvmid 100,102\n\tenabled 0\n\tnode pve1\n"
)


def client(node: Node) -> PveClient:  # noqa: F811
    def call(method: Method, path: str, params: Params) -> object:
        verb = next(cmd for cmd, name in CMDS.items() if name == method)
        return node.call(TOKEN, verb, path, **dict(params))

    return PveClient(call)


def write(node: Node, rel: str, text: str) -> None:  # noqa: F811
    path = node.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_token_reads_ha_resources_replication_and_backup_jobs(node: Node) -> None:  # noqa: F811
    write(node, "etc/pve/ha/resources.cfg", "vm: 100\n\tstate started\n\nct: 101\n\tmax_restart 2\n")
    write(node, "etc/pve/replication.cfg", REPLICATION_CFG)
    write(node, "etc/pve/jobs.cfg", JOBS_CFG)

    assert [item["sid"] for item in node.call(TOKEN, "get", "/cluster/ha/resources")] == ["vm:100", "ct:101"]
    assert node.call(TOKEN, "get", "/cluster/replication") == [
        {"disable": 1, "guest": 100, "id": "100-0", "jobnum": 0, "schedule": "*/15", "target": "pve2",
         "type": "local"},
        {"guest": 101, "id": "101-0", "jobnum": 0, "target": "pve2", "type": "local"},
    ]  # fmt: skip
    assert node.call(TOKEN, "get", "/cluster/backup") == [
        {"all": 1, "enabled": 1, "exclude": "101", "id": "backup-5f3c2a1b-7d4e", "mode": "snapshot",
         "prune-backups": {"keep-last": 3}, "schedule": "21:00", "storage": "local", "type": "vzdump"},
        {"enabled": 0, "id": "listed", "node": "pve1", "schedule": "sat 02:00", "type": "vzdump",
         "vmid": "100,102"},
    ]  # fmt: skip

    api = client(node)
    assert api.ha_resources() == ("vm:100", "ct:101")
    assert api.replication_jobs() == (ReplicationJob("100-0", 100), ReplicationJob("101-0", 101))
    assert api.backup_jobs() == (
        BackupJob("backup-5f3c2a1b-7d4e", all=True, exclude=(101,)),
        BackupJob("listed", vmids=(100, 102), node="pve1", enabled=False),
    )


def test_replication_lists_only_the_jobs_of_guests_the_token_may_audit(node: Node) -> None:  # noqa: F811
    write(node, "etc/pve/replication.cfg", REPLICATION_CFG)
    cfg = node.root / "etc/pve/user.cfg"
    cfg.write_text(api_setup.user_cfg() + f"acl:1:/vms/101:{TOKEN}:NoAccess:\n")

    assert client(node).replication_jobs() == (ReplicationJob("100-0", 100),)


@pytest.mark.parametrize("path", ["/cluster/ha/resources", "/cluster/backup"])
def test_error_ha_resources_and_backup_jobs_need_sys_audit_on_root(node: Node, path: str) -> None:  # noqa: F811
    cfg = node.root / "etc/pve/user.cfg"
    cfg.write_text(api_setup.user_cfg().replace(",Sys.Audit,", ","))

    with pytest.raises(access.PermissionDenied) as refused:
        node.call(TOKEN, "get", path)

    assert refused.value.text == "Permission check failed (/, Sys.Audit)\n"
