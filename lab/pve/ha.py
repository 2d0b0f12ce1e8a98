"""Stand-in for pve-ha-manager's read API (lab): `GET /cluster/ha/resources` and
`GET /cluster/ha/status/current`, from the files HA keeps in pmxcfs, as pve-ha-manager reads them.

- /etc/pve/ha/resources.cfg: a SectionConfig (PVE::HA::Resources): `vm: 100` / `ct: 101` headers, then
  tab-indented `key value` options (state, group, max_restart, max_relocate, failback, comment). The index
  returns each section as parsed (only the options the file sets), `sid` `vm:100`, `type`, and the file's
  `digest` (API2/HA/Resources.pm `index`, `$api_copy_config`).
- /etc/pve/ha/manager_status: the CRM's JSON (`master_node`, `timestamp`, `service_status` per sid with
  `node`, `state`, `running`). No CRM runs in the lab: a test writes this file to place a service.
- The status (API2/HA/Status.pm `status`): a `quorum` entry (the lab node is quorate), `master` when the
  manager status names one, `fencing`, then a `service` entry per sid in the manager status (sorted) and
  per configured sid it lacks, its node from the manager status or else the guest list (where the guest's
  config is: `read_and_check_resources_config`), `state` as PVE::HA::Tools `get_verbose_service_state`
  says it, `request_state` the configured state (default `started`).
No `lrm:` entries (no LRM runs). Pure: the handlers in pvelib/api/cluster.py pass the files' text and the
guest list.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

RESOURCES_CFG = "/etc/pve/ha/resources.cfg"
MANAGER_STATUS = "/etc/pve/ha/manager_status"
TYPES = ("vm", "ct")
_INT = ("max_restart", "max_relocate", "failback")


def parse_resources(text: str) -> dict[str, dict[str, Any]]:
    """resources.cfg -> sid -> options as parsed (`type` included). Sections of an unknown type and lines
    that are no `key value` are dropped, as SectionConfig does with a warning."""
    resources: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.split("\n"):
        if not line.strip():
            current = None
            continue
        header = re.fullmatch(r"(\S+):\s*(\S+)\s*", line)
        if header and not line[0].isspace():
            kind = header[1].lower()
            current = None
            if kind in TYPES and re.fullmatch(r"[1-9][0-9]{2,8}", header[2]):
                current = resources[f"{kind}:{header[2]}"] = {"type": kind}
            continue
        option = re.fullmatch(r"\s+(\S+)\s+(.*?)\s*", line)
        if current is not None and option:
            key, value = option[1], option[2]
            current[key] = int(value) if key in _INT and re.fullmatch(r"[0-9]+", value) else value
    return resources


def resources_index(text: str) -> list[dict[str, Any]]:
    """`GET /cluster/ha/resources`."""
    digest = hashlib.sha1(text.encode()).hexdigest()  # SectionConfig: sha1 of the file
    return [{**options, "sid": sid, "digest": digest} for sid, options in parse_resources(text).items()]


def verbose_state(service: dict[str, Any] | None, conf: dict[str, Any] | None) -> str:
    """PVE::HA::Tools::get_verbose_service_state."""
    if conf is None:
        return "deleting"
    requested = conf.get("state") or "ignored"
    if requested == "ignored":
        return "ignored"
    if conf.get("node") is None:
        return "not found"
    if service is None or service.get("state") is None:
        return "queued"
    state = str(service["state"])
    if state == "stopped":
        return {"started": "starting", "disabled": "disabled"}.get(requested, state)
    if state == "started":
        if requested in ("stopped", "disabled"):
            state = "stopping"
        if not service.get("running"):
            state = "starting"
    elif state == "error" and requested == "disabled":
        state = "clearing error flag"
    return state


def status_current(
    node: str, resources_text: str, manager_text: str | None, guests: dict[int, str]
) -> list[dict[str, Any]]:
    """`GET /cluster/ha/status/current`; `guests`: vmid -> the node its config is on."""
    status: dict[str, Any] = json.loads(manager_text) if manager_text else {}
    entries: list[dict[str, Any]] = [
        {"id": "quorum", "type": "quorum", "node": node, "status": "OK", "quorate": 1}
    ]
    master, stamp = status.get("master_node"), status.get("timestamp")
    active = master is not None and stamp is not None and time.time() - int(stamp) < 60
    if master is not None and stamp is not None:
        shown = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(int(stamp)))
        text = f"{master} ({'active' if active else 'old timestamp - dead?'}, {shown})"
        entries.append({"id": "master", "type": "master", "node": master, "status": text, "timestamp": stamp})
    armed = "armed" if active else "standby"
    entries.append(
        {
            "id": "fencing",
            "type": "fencing",
            "node": master or node,
            "status": f"{armed} (CRM watchdog {'active' if active else 'standby'})",
            "armed-state": armed,
        }
    )
    config = parse_resources(resources_text)
    for options in config.values():  # read_and_check_resources_config's defaults and placement
        options.setdefault("state", "started")
        if options["state"] == "enabled":
            options["state"] = "started"
        for key in ("failback", "max_restart", "max_relocate"):
            options.setdefault(key, 1)
    for sid, options in config.items():
        vmid = int(sid.split(":", 1)[1])
        if vmid in guests:
            options["node"] = guests[vmid]
    services: dict[str, dict[str, Any]] = status.get("service_status", {})
    for sid in [*sorted(services), *sorted(s for s in config if s not in services)]:
        entries.append(_service(sid, config.get(sid), services.get(sid)))
    return entries


def _service(sid: str, conf: dict[str, Any] | None, service: dict[str, Any] | None) -> dict[str, Any]:
    data: dict[str, Any] = {"id": f"service:{sid}", "type": "service", "sid": sid}
    if service is not None:
        data["node"] = service.get("node")
        data["crm_state"] = service.get("state")
    elif conf is not None:
        data["node"] = conf.get("node")
    data["state"] = verbose_state(service, conf)
    data["status"] = f"{sid} ({data.get('node') or '---'}, {data['state']})"
    if conf is not None:
        data["request_state"] = conf["state"]
        for key in ("group", "max_restart", "max_relocate", "failback", "comment"):
            if key in conf:
                data[key] = conf[key]
    return {k: v for k, v in data.items() if v is not None}
