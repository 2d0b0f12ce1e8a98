"""`/nodes/{node}/tasks[/{upid}/status|log]` (pve-manager API2/Tasks.pm)."""

from __future__ import annotations

import os
from typing import Any

from .. import access
from ..errors import ParamError
from ..formats import BOOL
from ..jsonschema import P
from ..rest import Call, Endpoint, Json
from ..tasks import UPID_RE, process_start, task_log_path


def get_task_status(call: Call) -> Json:
    upid = call.path_params["upid"]
    match = UPID_RE.fullmatch(upid)
    if not match:
        raise ParamError({"upid": "unable to parse worker upid"})
    node, _, pid_hex, pstart_hex, start_hex, task_type, task_id, user = match.groups()
    log_path = task_log_path(call.settings, upid, start_hex)
    if not log_path.is_file():
        raise ParamError({"upid": "no such task"})
    if not _owns_task(call.rpcenv, user):  # Tasks.pm read_task_status
        call.rpcenv.check(call.rpcenv.user, f"/nodes/{call.path_params.get('node', node)}", ("Sys.Audit",))
    pid, pstart = int(pid_hex, 16), int(pstart_hex, 16)
    try:
        running = process_start(pid) == pstart and pid != os.getpid()
    except (OSError, IndexError, ValueError):
        running = False
    result: dict[str, Any] = {
        "upid": upid,
        "node": node,
        "pid": pid,
        "pstart": pstart,
        "starttime": int(start_hex, 16),
        "type": task_type,
        "id": task_id,
        "user": user,
        "status": "running" if running else "stopped",
    }
    if split := access.split_tokenid(user):  # Tasks.pm $convert_token_task
        result["user"], result["tokenid"] = split
    if not running:
        lines = log_path.read_text().splitlines()
        last = lines[-1] if lines else ""
        if last == "TASK OK":
            result["exitstatus"] = "OK"
        elif last.startswith("TASK ERROR: "):
            result["exitstatus"] = last[len("TASK ERROR: ") :]
        elif last.startswith("TASK WARNINGS: "):
            result["exitstatus"] = last[len("TASK ") :]
        else:
            result["exitstatus"] = "unexpected status"
    return result


def get_task_log(call: Call) -> Json:
    """`GET /nodes/{node}/tasks/{upid}/log` (pve-manager API2/Tasks.pm read_task_log, PVE::Tools
    dump_logfile): the log's lines as `{n, t}`, `n` counting from 1, from line `start` (0-based), at most
    `limit` of them (50 by default, 0: all); the same checks as the task's status."""
    upid = call.path_params["upid"]
    match = UPID_RE.fullmatch(upid)
    if not match:
        raise ParamError({"upid": "unable to parse worker upid"})
    node, _, _, _, start_hex, _, _, user = match.groups()
    log_path = task_log_path(call.settings, upid, start_hex)
    if not log_path.is_file():
        raise ParamError({"upid": "no such task"})
    if not _owns_task(call.rpcenv, user):
        call.rpcenv.check(call.rpcenv.user, f"/nodes/{call.path_params.get('node', node)}", ("Sys.Audit",))
    lines = log_path.read_text().splitlines()
    start, limit = int(call.params.get("start", 0)), int(call.params.get("limit", 50))
    shown = lines[start:] if limit == 0 else lines[start : start + limit]
    return [{"n": start + index + 1, "t": line} for index, line in enumerate(shown)]


def _owns_task(rpcenv: access.RpcEnv, task_user: str) -> bool:
    """Tasks.pm $check_task_user: a token sees its own tasks, a user its own and its tokens'."""
    split = access.split_tokenid(task_user)
    return rpcenv.user == task_user or (split is not None and rpcenv.user == split[0])


def list_tasks(call: Call) -> Json:
    """`GET /nodes/{node}/tasks`: every task with a log, newest first; an ended one (its log has a `TASK`
    line, or its process is gone) with `status` (its exit status, as the status endpoint gives it) and
    `endtime` (the log's mtime). Filters: `vmid`, `typefilter`, `limit` (default 50); `source` is accepted,
    every task being listed (this stand-in keeps no separate active list)."""
    tasks = []
    rpcenv = call.rpcenv
    auditor = rpcenv.check(rpcenv.user, f"/nodes/{call.path_params['node']}", ("Sys.Audit",), noerr=True)
    for log_path in call.settings.path("/var/log/pve/tasks").glob("*/UPID:*"):
        upid = log_path.name
        match = UPID_RE.fullmatch(upid)
        if match is None or not (auditor or _owns_task(rpcenv, match.group(8))):
            continue
        task = get_task_status(Call(call.settings, {"upid": upid}, {}))
        if "vmid" in call.params and task["id"] != str(call.params["vmid"]):
            continue
        if call.params.get("typefilter") not in (None, task["type"]):
            continue
        entry = {
            key: task[key]
            for key in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user", "tokenid")
            if key in task
        }
        if task["status"] != "stopped":  # an active task: its user as the UPID has it
            entry["user"] = match.group(8)
            entry.pop("tokenid", None)
        if task["status"] == "stopped":
            entry.update(status=task["exitstatus"], endtime=int(log_path.stat().st_mtime))
        tasks.append(entry)
    tasks.sort(key=lambda task: (task["starttime"], task["upid"]), reverse=True)
    return tasks[: int(call.params.get("limit", 50))]


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", r"nodes/(?P<node>[^/]+)/tasks/(?P<upid>[^/]+)/status", Endpoint("GET", {}, get_task_status)),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/tasks/(?P<upid>[^/]+)/log",
        Endpoint(
            "GET",
            {"start": P(type="integer", minimum=0), "limit": P(type="integer", minimum=0), "download": BOOL},
            get_task_log,
        ),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/tasks",
        Endpoint(
            "GET",
            {
                "vmid": P(type="integer", minimum=100),
                "typefilter": P(),
                "source": P(enum=("archive", "active", "all")),
                "limit": P(type="integer", minimum=0),
            },
            list_tasks,
        ),
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/nodes/{node}/tasks"): access.ALL_USERS,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): access.ALL_USERS,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): access.ALL_USERS,
}
