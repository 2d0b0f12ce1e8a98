"""The cluster's reads of what holds a guest: `/cluster/ha/resources`, `/cluster/ha/status/current`
(lab/pve/ha.py), `/cluster/replication` and `/cluster/backup`."""

from __future__ import annotations

from .. import access, ha
from ..guest_config import LXC_DIR, QEMU_DIR, guest_ids
from ..jsonschema import P
from ..pmxcfs import text_or_none
from ..rest import Call, Endpoint, Json
from ..sectionconfig import JOBS_CFG, REPLICATION_CFG, VZDUMP_TYPES, parse_replication, parse_section_cfg


def list_replication(call: Call) -> Json:
    """pve-manager API2/ReplicationConfig.pm `index`: every job, ids sorted, `id` added; only those of the
    guests the user has VM.Audit on."""
    rpcenv = call.rpcenv
    jobs = parse_replication(text_or_none(call.settings.path(REPLICATION_CFG)) or "")
    return [
        {**jobs[job_id], "id": job_id}
        for job_id in sorted(jobs)
        if rpcenv.check(rpcenv.user, f"/vms/{jobs[job_id]['guest']}", ("VM.Audit",), noerr=True)
    ]


def list_backup_jobs(call: Call) -> Json:
    """pve-manager API2/Backup.pm `index` (Sys.Audit on `/`, its permissions clause): the `vzdump` jobs of
    jobs.cfg (PVE::Jobs::Plugin, a SectionConfig) in file order, each with `id` and `type`. Not modelled:
    the legacy jobs of vzdump.cron and `next-run` (a calendar event's next time)."""
    sections = parse_section_cfg(text_or_none(call.settings.path(JOBS_CFG)) or "", {"vzdump": VZDUMP_TYPES})
    return [{**options, "type": kind, "id": job_id} for kind, job_id, options in sections]


def list_ha_resources(call: Call) -> Json:
    return ha.resources_index(text_or_none(call.settings.path(ha.RESOURCES_CFG)) or "")


def get_ha_status(call: Call) -> Json:
    settings = call.settings
    guests = {vmid: settings.node for folder in (QEMU_DIR, LXC_DIR) for vmid in guest_ids(settings, folder)}
    return ha.status_current(
        settings.node,
        text_or_none(settings.path(ha.RESOURCES_CFG)) or "",
        text_or_none(settings.path(ha.MANAGER_STATUS)),
        guests,
    )


ROUTES: list[tuple[str, str, Endpoint]] = [
    (
        "get",
        r"cluster/ha/resources",
        Endpoint("GET", {"type": P(enum=("vm", "ct"))}, list_ha_resources),
    ),
    ("get", r"cluster/ha/status/current", Endpoint("GET", {}, get_ha_status)),
    ("get", r"cluster/replication", Endpoint("GET", {}, list_replication)),
    ("get", r"cluster/backup", Endpoint("GET", {}, list_backup_jobs)),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/cluster/ha/resources"): access.Perm("/", ("Sys.Audit",)),
    ("GET", "/cluster/ha/status/current"): access.Perm("/", ("Sys.Audit",)),
    ("GET", "/cluster/replication"): access.ALL_USERS,  # filtered by VM.Audit inside,
    ("GET", "/cluster/backup"): access.Perm("/", ("Sys.Audit",)),
}
