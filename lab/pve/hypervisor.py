"""The lab hypervisor of one Proxmox lab node: starts and stops the node's VM guests and containers as lab
hosts, and runs commands in its containers.

The pvesh and pct stand-ins run inside the node's namespaces and cannot start lab hosts themselves. They
write a request into the node's `/var/lib/pvegpu-lab/hv/` (`<vmid>-<action>-<nonce>.request`, JSON) and wait
for the `.answer` beside it. This process runs on the lab machine (started with the node, stopped by
`lab down NODE`), sees the same directory through the node's root, and answers each request in turn:

- `{"action": "start", "vmid": N, "devices": [{"hostpci": i, "pcie": true, "functions": [...]}, ...]}`
  (a VM): brings up the guest lab host `<node>v<vmid>` with the Q35 sysfs of those devices (lab.pve.guest),
  copied from the node's current topology, no driver bound, and the guest's software sources installed
  (lab.guest_payload: stand-in NVIDIA apt repository, sglang wheel);
  answers `{"ok": true, "pid": <PID>, "guest": <name>}`;
- `{"action": "stop", "vmid": N}`: stops that guest; answers `{"ok": true}`;
- `{"action": "start", "type": "lxc", "vmid": N, "dev": [{"path": "/dev/nvidia0", "gid": "44"}, ...]}`
  (a CT; `dev`: its devN entries): brings up the container lab host `<node>c<vmid>` (lab.pve.container: the
  node's sysfs, its device nodes and module version, the software sources); answers
  `{"ok": true, "pid": <PID>, "guest": <name>}`;
- `{"action": "stop", "type": "lxc", "vmid": N}`: stops that container host; answers `{"ok": true}`;
- `{"action": "exec", "type": "lxc", "vmid": N, "argv": [...], "timeout_s": S}` (`pct exec`): runs argv in
  the container host as root over SSH; answers `{"ok": true, "status": N, "stdout": ..., "stderr": ...}`.
Failures answer `{"ok": false, "error": "<message>"}`: a start task fails with `start failed: <message>`.
Guests and container hosts are the node's dependents: `lab down NODE` stops them.

    python -m lab.pve.hypervisor NODE STATE_DIR [--guest-mode nspawn|netns]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, cast

from lab import guest_payload, hosts
from lab.pve import container
from lab.pve.guest import GuestError, Passed, q35_guest
from lab.pve.node import GUEST_RECORD, HV_DIR
from lab.topologies import TOPOLOGIES

POLL_S = 0.1
EXEC_TIMEOUT_S = 170.0  # under pct's wait (the stand-ins' hypervisor_timeout_s, 180 s by default)


def guest_name(node: str, vmid: int) -> str:
    """The lab host name of VM `vmid`'s guest on `node`."""
    return f"{node}v{vmid}"


def handle(node: str, request: dict[str, Any], guest_mode: hosts.Mode) -> dict[str, Any]:
    """Carry out one request; the answer the stand-in reads."""
    if request.get("type") == "lxc":
        return handle_container(node, request, guest_mode)
    name = guest_name(node, int(request["vmid"]))
    if request["action"] == "stop":
        hosts.down(name)
        hosts.remove_dependent(node, name)
        return {"ok": True}
    passed = [Passed(d["hostpci"], tuple(d["functions"]), d["pcie"]) for d in request["devices"]]
    try:
        topology = q35_guest(name, TOPOLOGIES[hosts.get_host(node).topology], passed)
    except GuestError as error:
        return {"ok": False, "error": str(error)}
    hosts.add_dependent(node, name)  # before up: a `lab down NODE` meanwhile still finds it
    try:
        guest = hosts.up(name, topology, guest_mode, replace=True, driver="none")
        guest_payload.install(guest)
    except (hosts.LabError, guest_payload.PayloadError) as error:
        hosts.down(name)
        hosts.remove_dependent(node, name)
        return {"ok": False, "error": str(error).splitlines()[0]}
    record = {"node": node, "vmid": int(request["vmid"])}
    (guest.state_dir / GUEST_RECORD).write_text(json.dumps(record, sort_keys=True) + "\n")
    return {"ok": True, "pid": guest.pid, "guest": guest.name}


def handle_container(node: str, request: dict[str, Any], guest_mode: hosts.Mode) -> dict[str, Any]:
    """A CT request (module docstring)."""
    vmid = int(request["vmid"])
    if request["action"] == "stop":
        container.down(node, vmid)
        return {"ok": True}
    if request["action"] == "exec":
        timeout_s = float(request.get("timeout_s", EXEC_TIMEOUT_S))
        return container.run(node, vmid, [str(a) for a in request["argv"]], timeout_s)
    try:
        host = container.up(node, vmid, list(request["dev"]), guest_mode)
    except (container.ContainerError, hosts.LabError, guest_payload.PayloadError) as error:
        return {"ok": False, "error": str(error).splitlines()[0]}
    return {"ok": True, "pid": host.pid, "guest": host.name}


def serve(node: str, state: Path, guest_mode: hosts.Mode) -> None:
    """Answer requests until the node's state directory is gone."""
    folder = state / "merged" / HV_DIR
    while state.is_dir():
        for request_path in sorted(folder.glob("*.request")) if folder.is_dir() else []:
            request = json.loads(request_path.read_text())
            try:
                answer = handle(node, request, guest_mode)
            except Exception as error:  # any failure must reach the waiting task
                traceback.print_exc()
                answer = {"ok": False, "error": f"lab hypervisor: {error}"}
            print(f"{request_path.name}: {json.dumps(answer, sort_keys=True)}", flush=True)
            partial = request_path.with_suffix(".partial")
            partial.write_text(json.dumps(answer, sort_keys=True))
            request_path.unlink()
            partial.rename(request_path.with_suffix(".answer"))
        time.sleep(POLL_S)


def _exit(signum: int, frame: FrameType | None) -> None:
    del frame
    raise SystemExit(128 + signum)  # unwinds a guest start in progress, which cleans up after itself


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.pve.hypervisor", description=__doc__)
    parser.add_argument("node")
    parser.add_argument("state", type=Path)
    parser.add_argument("--guest-mode", default="nspawn", choices=hosts.MODES)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit)
    serve(args.node, args.state, cast(hosts.Mode, args.guest_mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
