#!/usr/bin/python3
"""pct: the pvegpu lab's STAND-IN for Proxmox VE's `pct`. This is NOT Proxmox; only `pct exec` is modelled.

Installed into lab Proxmox nodes as /usr/bin/pct (Debian's python3, stdlib only), beside the pvesh stand-in
whose settings it reads ($PVEGPU_LAB_PVE_CONFIG, default /etc/pvegpu-lab/pve.json: node, root,
hypervisor_dir, hypervisor_timeout_s).

    pct exec <vmid> [--] <command> [<arg>...]

Like pve-container's `pct exec` (src/PVE/CLI/pct.pm): the CT config must exist on this node, else
`Configuration file 'nodes/<node>/lxc/<vmid>.conf' does not exist` (exit 255); no command: `missing command`
(exit 255); then it is `lxc-attach -n <vmid> -- <command>...`: a stopped container (no
/run/lxc/<vmid>.running, the pvesh stand-in's record) fails as lxc-attach does (`... Failed to get init pid`,
exit 1); a running one runs the command as root in the container lab host (the lab hypervisor runs it over
SSH, no shell in between) and pct prints its stdout and stderr and exits with its status.

Any other subcommand: a usage line, exit 1 (STAND-IN: the real pct has many more).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

CONFIG_ENV = "PVEGPU_LAB_PVE_CONFIG"
DEFAULT_CONFIG = "/etc/pvegpu-lab/pve.json"
VMID = re.compile(r"[1-9][0-9]{2,8}")
USAGE = "USAGE: pct exec <vmid> [<extra-args>] (pvegpu lab STAND-IN: only `pct exec` is modelled)\n"
# lxc-attach's error for a stopped container, as a real capture shows it (`lxc-attach: <name>: attach.c:
# lxc_attach: 1314 Failed to get init pid`); the source file and line number vary with the lxc build.
NOT_RUNNING = "lxc-attach: {vmid}: attach.c: lxc_attach: 1314 Failed to get init pid\n"


def fail(text: str, code: int) -> int:
    sys.stdout.flush()
    sys.stderr.write(text)
    return code


def ask(settings: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Write a request for the lab hypervisor and wait for its answer (lab/pve/hypervisor.py)."""
    folder = Path(settings["hypervisor_dir"])
    name = f"{request['vmid']}-{request['action']}-{uuid.uuid4().hex[:8]}"
    partial = folder / f".{name}.tmp"
    partial.write_text(json.dumps(request, sort_keys=True))
    partial.rename(folder / f"{name}.request")
    answer_path = folder / f"{name}.answer"
    deadline = time.monotonic() + float(settings.get("hypervisor_timeout_s", 180))
    while not answer_path.is_file():
        if time.monotonic() > deadline:
            (folder / f"{name}.request").unlink(missing_ok=True)
            return {"ok": False, "error": "lab hypervisor did not answer"}
        time.sleep(0.1)
    answer: dict[str, Any] = json.loads(answer_path.read_text())
    answer_path.unlink()
    return answer


def exec_in(settings: dict[str, Any], vmid: str, command: list[str]) -> int:
    root = Path(settings.get("root", "/"))
    if not (root / f"etc/pve/lxc/{vmid}.conf").is_file():
        return fail(f"Configuration file 'nodes/{settings['node']}/lxc/{vmid}.conf' does not exist\n", 255)
    if not command:
        return fail("missing command\n", 255)
    if not (root / f"run/lxc/{vmid}.running").is_file():
        return fail(NOT_RUNNING.format(vmid=vmid), 1)
    if not settings.get("hypervisor_dir"):
        return fail("pct (pvegpu lab STAND-IN): no lab hypervisor runs the containers of this node\n", 255)
    timeout_s = float(settings.get("hypervisor_timeout_s", 180)) - 10
    request = {"action": "exec", "type": "lxc", "vmid": int(vmid), "argv": command, "timeout_s": timeout_s}
    answer = ask(settings, request)
    if not answer.get("ok"):
        return fail(f"pct (pvegpu lab STAND-IN): {answer.get('error', 'lab hypervisor failed')}\n", 255)
    sys.stdout.write(answer["stdout"])
    sys.stdout.flush()
    sys.stderr.write(answer["stderr"])
    return int(answer["status"])


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "exec":
        return fail(USAGE, 1)
    vmid, command = argv[1], argv[2:]
    if not VMID.fullmatch(vmid):
        return fail(
            f"400 Parameter verification failed.\nvmid: value does not look like a valid VM ID\n{USAGE}", 255
        )
    if command[:1] == ["--"]:
        command = command[1:]
    settings = json.loads(Path(os.environ.get(CONFIG_ENV, DEFAULT_CONFIG)).read_text())
    return exec_in(settings, vmid, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
