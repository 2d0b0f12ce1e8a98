"""The lab hypervisor of one Proxmox lab node: starts and stops the node's VM guests and containers as lab
hosts, and runs commands in its containers.

The pvesh and pct stand-ins run inside the node's namespaces and cannot start lab hosts themselves. They
write a request into the node's `/var/lib/pvegpu-lab/hv/` (`<vmid>-<action>-<nonce>.request`, JSON) and wait
for the `.answer` beside it. This process runs on the lab machine (started with the node, stopped by
`lab down NODE`), sees the same directory through the node's root, and answers each request in turn:

- `{"action": "start", "vmid": N, "devices": [{"hostpci": i, "pcie": true, "functions": [...], "vendors":
  {function: "0x10de"}, "classes": {function: "0x030000"}}, ...], "machine": "q35"|"pc", "bios":
  "ovmf"|"seabios", "mac": net0's MAC, "disk": null | {"key", "volume", "path"}, "cloud_init": null |
  {"user_data", "ipconfig0", "hostname", "mac"}, "virtiofs": [{"index": N, "dirid", "path": the directory
  mapping's directory on the node}, ...], "config": {the VM's config}}` (a VM): first, real QEMU
  judges the command line qemu-server would build from `config` (lab.pve.qemu_cmdline, lab.pve.qemu_check:
  nothing runs); a refusal answers `{"ok": false, "error": "QEMU exited with code 1", "log": [QEMU's
  stderr lines]}` (vm_start_nolock's error; the stand-in puts the log lines in the task log) and nothing
  starts. Then the VM boots only when
  its boot disk's data file (`path`, in the node's root) is a lab image (lab.images) whose system the firmware
  can start (OVMF needs an EFI system partition; SeaBIOS starts any); otherwise it "runs" with nothing booted
  and answers `{"ok": true, "pid": <this process>, "guest": null}`. A booting VM brings up the guest lab host
  `<node>v<vmid>` with the Q35 (or i440FX, machine `pc`) sysfs of those devices (lab.pve.guest), copied from
  the node's current topology, no driver bound, and the guest's software sources installed (lab.guest_payload:
  stand-in NVIDIA apt repository, sglang wheel) and its stand-in Hugging Face hub, served on the guest's veth
  until the guest stops (lab.hub: the model fetch's source). Each `virtiofs` entry's directory (the node's
  root + `path`) is bind-mounted at `/var/lib/pvegpu-lab/virtiofs/<dirid>` in the guest's root before the
  guest starts, and every booting guest gets the LAB STAND-IN `/sbin/mount.virtiofs` (lab.pve.shares,
  lab/standins/mount_virtiofs.py), so that `mount -t virtiofs <dirid> DIR [-o ro]` in the guest mounts the
  node's directory as qemu-server's `vhost-user-fs-pci,...,tag=<dirid>` device gives it to a real guest (a
  tag without a device fails as mount(8) does: exit status 32). A cloud image's first boot applies
  `cloud_init` (lab.cloud_init: hostname, users and keys, SSH host key, address; the lab does not record its
  host key); an installed system (not a cloud image) gets the lab's own identity. When the guest runs
  qemu-guest-agent, the agent's `network-get-interfaces` answer goes to
  `<node root>/var/lib/pvegpu-lab/agent/<vmid>.json` (the stand-in reads it). Answers
  `{"ok": true, "pid": <PID>, "guest": <name>}`;
- `{"action": "stop", "vmid": N}`: stops that guest and its agent; answers `{"ok": true}`;
- `{"action": "agent", "vmid": N, "command": C, "params": {...}}`: the guest agent's command C (get-fsinfo,
  file-read, file-write, exec, exec-status), answered `{"ok": true, "result": ...}` or `{"ok": false,
  "error": <qemu-ga's error>}` (lab.pve.agent), `"error": "QEMU guest agent is not running"` without one;
- `{"action": "start", "type": "lxc", "vmid": N, "dev": [{"path": "/dev/nvidia0", "gid": "44"}, ...], "mp":
  [{"key": "mp0", "source": "/var/lib/...", "target": "/srv/models/X", "ro": true}, ...]}` (a CT; `dev`: its
  devN entries; `mp`: its mpN bind mounts of a node directory, in index order): brings up the container lab
  host `<node>c<vmid>` (lab.pve.container: the node's sysfs, its device nodes and module version, the
  software sources, each `mp` source bind-mounted at its target, read-only for `ro`); answers
  `{"ok": true, "pid": <PID>, "guest": <name>}`;
- `{"action": "stop", "type": "lxc", "vmid": N}`: stops that container host; answers `{"ok": true}`;
- `{"action": "exec", "type": "lxc", "vmid": N, "argv": [...], "timeout_s": S}` (`pct exec`): runs argv in
  the container host as root over SSH; answers `{"ok": true, "status": N, "stdout": ..., "stderr": ...}`.
Failures answer `{"ok": false, "error": "<message>"}`: a start task fails with `start failed: <message>`.
Guests and container hosts are the node's dependents: `lab down NODE` stops them.

Before it answers requests, the hypervisor serves the node itself a stand-in Hugging Face hub (lab.hub
`provide`: `/root/hf-token` in the node's root, `<node state>/hub.json`, served at the node's gateway
10.200.<index>.1:8091, lab.hub `node_endpoint`: the model fetched into the node's store), then the lab's
images (lab.images); it closes the hubs (the node's and its guests') when it exits.

    python -m lab.pve.hypervisor NODE STATE_DIR [--guest-mode nspawn|netns]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, cast

from lab import cloud_init, guest_payload, hosts, hub, images
from lab.errors import LabError
from lab.pve import agent, container, qemu_check, shares
from lab.pve.guest import GuestError, Passed, guest_topology
from lab.pve.node import GUEST_RECORD, HV_DIR
from lab.pve.qemu_cmdline import HostPci
from lab.pve.qemu_config import QemuCmdlineError
from lab.topologies import TOPOLOGIES

POLL_S = 0.1
EXEC_TIMEOUT_S = 170.0  # under pct's wait (the stand-ins' hypervisor_timeout_s, 180 s by default)


# The stand-in hub of each running guest (lab/hub.py), on its veth: the model fetch's source.
_HUBS: dict[str, hub.Hub] = {}


def _close_hub(name: str) -> None:
    served = _HUBS.pop(name, None)
    if served is not None:
        served.close()


def guest_name(node: str, vmid: int) -> str:
    """The lab host name of VM `vmid`'s guest on `node`."""
    return f"{node}v{vmid}"


def handle(node: str, request: dict[str, Any], guest_mode: hosts.Mode) -> dict[str, Any]:
    """Carry out one request; the answer the stand-in reads."""
    if request.get("type") == "lxc":
        return handle_container(node, request, guest_mode)
    vmid = int(request["vmid"])
    name = guest_name(node, vmid)
    node_host = hosts.get_host(node)
    if request["action"] == "agent":
        return agent.handle(name, request)
    if request["action"] == "stop":
        agent.remove(node_host, vmid)
        _close_hub(name)
        hosts.down(name)
        hosts.remove_dependent(node, name)
        return {"ok": True}
    return start_vm(node_host, name, request, guest_mode)


def start_vm(
    node_host: hosts.LabHost, name: str, request: dict[str, Any], guest_mode: hosts.Mode
) -> dict[str, Any]:
    """A VM start (module docstring): guest lab host `name` boots when the VM's disk holds a bootable
    image."""
    node, vmid = node_host.name, int(request["vmid"])
    try:
        refusal = qemu_verdict(vmid, request, node_host.root)
    except (
        QemuCmdlineError
    ) as error:  # what qemu-server's config_to_command dies of (the stand-in checks first)
        return {"ok": False, "error": str(error)}
    if refusal is not None:
        return {"ok": False, "error": "QEMU exited with code 1", "log": refusal}
    disk = request.get("disk")
    image = images.read_image_file(node_host.root / str(disk["path"]).lstrip("/")) if disk else None
    if image is None or (request.get("bios", "seabios") == "ovmf" and not image.esp):
        return {"ok": True, "pid": os.getpid(), "guest": None}  # the firmware finds nothing to boot
    passed = [Passed(d["hostpci"], tuple(d["functions"]), d["pcie"]) for d in request["devices"]]
    try:
        topology = guest_topology(name, TOPOLOGIES[node_host.topology], str(request["machine"]), passed)
        first_boot = cloud_init.setup(request.get("cloud_init"), image) if image.cloud_init else None
    except (GuestError, cloud_init.CloudInitError) as error:
        return {"ok": False, "error": str(error)}
    hosts.add_dependent(node, name)  # before up: a `lab down NODE` meanwhile still finds it
    try:
        binds = shares.virtiofs_binds(node_host.root, list(request.get("virtiofs") or []))

        def customize(root: Path) -> None:
            if first_boot is not None:
                cloud_init.apply(root, first_boot)
            shares.bind_virtiofs(root, binds)

        guest = hosts.up(
            name,
            topology,
            guest_mode,
            replace=True,
            driver="none",
            index=first_boot.index if first_boot else None,
            record_host_key=first_boot is None,
            customize=customize,
        )
        guest_payload.install(guest)
        _close_hub(name)
        _HUBS[name] = hub.provide(guest)
        for path, content in images.esp_files(image).items():
            (guest.root / "boot/efi" / path).parent.mkdir(parents=True, exist_ok=True)
            (guest.root / "boot/efi" / path).write_bytes(content)
    except (LabError, guest_payload.PayloadError, cloud_init.CloudInitError) as error:
        hosts.down(name)
        hosts.remove_dependent(node, name)
        return {"ok": False, "error": str(error).splitlines()[0]}
    record = {
        "node": node,
        "vmid": vmid,
        "os": image.os,
        "esp": image.esp,
        "cloud_init": image.cloud_init,
        "agent": image.agent or bool(first_boot and first_boot.agent),
    }
    (guest.state_dir / GUEST_RECORD).write_text(json.dumps(record, sort_keys=True) + "\n")
    if record["agent"]:
        mac = (request.get("cloud_init") or {}).get("mac") or request.get("mac")
        agent.write_interfaces(node_host, vmid, guest, str(request.get("machine", "pc")), mac)
    return {"ok": True, "pid": guest.pid, "guest": guest.name}


def qemu_verdict(vmid: int, request: dict[str, Any], root: Path) -> list[str] | None:
    """Real QEMU's verdict on the start's command line (lab.pve.qemu_check): None, or QEMU's stderr lines;
    each virtiofsN's directory is the node's (`root`, the node's root on this machine). Raises
    QemuCmdlineError for a config qemu-server could not turn into a command line."""
    conf = {str(k): str(v) for k, v in dict(request.get("config") or {}).items()}
    devices = [
        HostPci(int(d["hostpci"]), tuple(d["functions"]), d.get("vendors") or {}, d.get("classes") or {})
        for d in request.get("devices", [])
    ]
    shared = {int(v["index"]): str(root / str(v["path"]).lstrip("/")) for v in request.get("virtiofs", [])}
    return qemu_check.verdict(vmid, conf, devices, shared_dirs=shared)


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
        host = container.up(node, vmid, list(request["dev"]), guest_mode, list(request.get("mp") or []))
    except (container.ContainerError, LabError, guest_payload.PayloadError) as error:
        return {"ok": False, "error": str(error).splitlines()[0]}
    return {"ok": True, "pid": host.pid, "guest": host.name}


def serve(node: str, state: Path, guest_mode: hosts.Mode) -> None:
    """Serve the node its stand-in hub (lab.hub, at its gateway: the model fetched into the node's store) and
    the lab's images (lab.images), then answer requests until the node's state directory is gone; the hubs
    (the node's, its guests') close when this ends."""
    node_host = hosts.get_host(node)
    _HUBS[node] = hub.provide(node_host)  # before the images: lab.pve.node.up waits for those
    images.serve(node_host)
    folder = state / "merged" / HV_DIR
    try:
        while state.is_dir():
            for request_path in sorted(folder.glob("*.request")) if folder.is_dir() else []:
                answer_request(node, request_path, guest_mode)
            time.sleep(POLL_S)
    finally:
        for name in list(_HUBS):
            _close_hub(name)


def answer_request(node: str, request_path: Path, guest_mode: hosts.Mode) -> None:
    """Carry out one request file and write its answer beside it."""
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
