"""`/nodes/{node}/qemu/{vmid}/agent/...` (qemu-server API2/Qemu/Agent.pm): the lab hypervisor answers."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from .. import access
from ..errors import DieError
from ..formats import BOOL
from ..guest_config import load_guest
from ..hypervisor import hypervisor_request, is_running
from ..jsonschema import P
from ..rest import VMS, Call, Endpoint, Json

AGENT_DIR = "/var/lib/pvegpu-lab/agent"  # <vmid>.json: the lab hypervisor's network-get-interfaces answer


def _agent_available(call: Call) -> Path:
    """QemuServer/Agent.pm assert_agent_available: configured, VM running, agent answering (the lab
    hypervisor wrote the guest's agent file); returns that file."""
    vmid = call.path_params["vmid"]
    conf = load_guest(call, "qemu")
    if "agent" not in conf.main:
        raise DieError("No QEMU guest agent configured\n")
    if not is_running(call):
        raise DieError(f"VM {vmid} is not running\n")
    agent = call.settings.path(f"{AGENT_DIR}/{vmid}.json")
    if not agent.is_file():
        raise DieError("QEMU guest agent is not running\n")
    return agent


def agent_network(call: Call) -> Json:
    return json.loads(_agent_available(call).read_text())


def agent_command(call: Call, command: str, params: dict[str, Any]) -> Any:
    """A guest agent command the lab hypervisor carries out in the guest: its `result`; its `error` fails
    the call as check_agent_error does (`Agent error: <error>`)."""
    _agent_available(call)
    request = {"action": "agent", "vmid": int(call.path_params["vmid"]), "command": command, "params": params}
    return hypervisor_request(call, request, "Agent error: ").get("result")


def agent_fsinfo(call: Call) -> Json:
    return {"result": agent_command(call, "get-fsinfo", {})}


def agent_file_read(call: Call) -> Json:
    return agent_command(call, "file-read", dict(call.params))


def agent_file_write(call: Call) -> Json:
    """`content` reaches the hypervisor decoded (with encode=0 the caller sent it base64-encoded)."""
    content = call.params["content"]
    if call.params.get("encode", 1) == 0:
        content = base64.b64decode(content).decode(errors="replace")
    agent_command(call, "file-write", {"file": call.params["file"], "content": content})
    return None


def agent_exec(call: Call) -> Json:
    return agent_command(call, "exec", dict(call.params))


def agent_exec_status(call: Call) -> Json:
    return agent_command(call, "exec-status", {"pid": call.params["pid"]})


AGENT_PATH = r"nodes/(?P<node>[^/]+)/qemu/(?P<vmid>[^/]+)/agent"


ROUTES: list[tuple[str, str, Endpoint]] = [
    ("get", f"{AGENT_PATH}/network-get-interfaces", Endpoint("GET", {}, agent_network)),
    ("get", f"{AGENT_PATH}/get-fsinfo", Endpoint("GET", {}, agent_fsinfo)),
    (
        "get",
        f"{AGENT_PATH}/file-read",
        Endpoint(
            "GET",
            {
                "file": P(optional=False),
                "count": P(type="integer", minimum=1, maximum=16 * 1024 * 1024),
                "decode": BOOL,
                "offset": P(type="integer", minimum=0),
            },
            agent_file_read,
        ),
    ),
    (
        "create",
        f"{AGENT_PATH}/file-write",
        Endpoint(
            "POST",
            {"file": P(optional=False), "content": P(optional=False, max_length=60 * 1024), "encode": BOOL},
            agent_file_write,
            True,
        ),
    ),
    (
        "create",
        f"{AGENT_PATH}/exec",
        Endpoint(
            "POST",
            {"command": P(type="array", optional=False, items=P()), "input-data": P(max_length=64 * 1024)},
            agent_exec,
        ),
    ),
    (
        "get",
        f"{AGENT_PATH}/exec-status",
        Endpoint("GET", {"pid": P(type="integer", optional=False)}, agent_exec_status),
    ),
]


_AGENT = "/nodes/{node}/qemu/{vmid}/agent"


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", f"{_AGENT}/network-get-interfaces"): access.Perm(
        VMS, ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("GET", f"{_AGENT}/get-fsinfo"): access.Perm(
        VMS, ("VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("GET", f"{_AGENT}/file-read"): access.Perm(
        VMS, ("VM.GuestAgent.FileRead", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("POST", f"{_AGENT}/file-write"): access.Perm(
        VMS, ("VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted"), any=True
    ),
    ("POST", f"{_AGENT}/exec"): access.Perm(VMS, ("VM.GuestAgent.Unrestricted",)),
    ("GET", f"{_AGENT}/exec-status"): access.Perm(VMS, ("VM.GuestAgent.Unrestricted",)),
}
