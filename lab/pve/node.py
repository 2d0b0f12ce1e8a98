"""Proxmox lab nodes: a lab host with the pvesh and pct stand-ins installed and a lab hypervisor for its
guests.

`up(name, topology)` starts the host (lab.hosts), then installs into its root:
- `/usr/bin/pvesh`: lab/pve/pvesh.py, the STAND-IN for Proxmox's pvesh;
- `/usr/bin/pct`: lab/pve/pct.py, the STAND-IN for Proxmox's pct (`pct exec` only);
  each as a module in `/usr/lib/pvegpu-lab/` and a launcher that imports it, so that the node's python caches
  its bytecode: run as a script, the 3,000-line pvesh was compiled on every call (~50 ms of the node's CPU,
  four times in a no-op site run); beside them what they import: the package lab/pve/pvelib/ (the STAND-IN
  for Proxmox's API, copied whole as /usr/lib/pvegpu-lab/pvelib/), lab/pve/access.py (its access control),
  lab/pve/pveproxy.py (its HTTPS API server), lab/pve/ha.py (its HA API) and pvegpu's section-config reader
  (pvegpu/facts/section_config.py, standard library only: the node has no pvegpu, so the file is shipped
  alone, as pvegpu/hook/bundle.py ships the hook's modules);
- `/usr/bin/pveversion`: a STAND-IN printing the release the pvesh stand-in reports;
- `/etc/pvegpu-lab/pve.json`: the stand-ins' settings (node name, the node's sysfs root, the hypervisor
  request directory);
- `/etc/pve/nodes/<name>/qemu-server` and `.../lxc`, with `/etc/pve/qemu-server` and `/etc/pve/lxc` links
  to them, as pmxcfs shows a node its own guests' configs;
plus the HTTPS API's certificate, the pvegpu user, token, role and ACLs (lab/pve/api_setup.py); starts the
pveproxy stand-in inside the node (port 8006; it ends with the node) and `python -m lab.pve.hypervisor` as
the host's companion (stopped by `lab down NAME`, which also stops the VM guests and container hosts it
started), which also serves the lab's cloud images to the node (lab.images: `image_url`); `up` returns once
both answer.

Which lab hosts are what (for inventories): a Proxmox node's state directory holds `pve-node.json` (the
stand-ins' settings), a VM guest's holds `pve-guest.json` (`{"node", "vmid", "os", "esp", "cloud_init",
"agent"}`: the image it booted, lab.images) and a container host's `pve-container.json` (`{"node", "vmid"}`);
see `role_of`.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from lab import hosts, images
from lab.errors import LabError
from lab.pve import api_setup

PVESH = Path(__file__).with_name("pvesh.py")
PCT = Path(__file__).with_name("pct.py")
# Modules the stand-ins import (by these names: a stand-in run as a script finds its siblings).
LIBRARIES = (
    *(Path(__file__).with_name(name) for name in ("access.py", "pveproxy.py", "ha.py")),
    Path(__file__).resolve().parents[2] / "pvegpu/facts/section_config.py",
)
PACKAGE = Path(__file__).with_name("pvelib")  # the stand-in's API, copied whole beside the modules
STANDIN_DIR = "usr/lib/pvegpu-lab"  # the stand-ins' modules, in the node's root
# The launcher of a stand-in (`{module}`: its module in STANDIN_DIR).
LAUNCHER = """#!/usr/bin/python3
# LAB STAND-IN for Proxmox VE's {command} (pvegpu lab, lab/pve/node.py): /{directory}/{module}.py is the code.
import sys

sys.path.insert(0, "/{directory}")
import {module}  # noqa: E402

sys.exit({module}.main(sys.argv[1:]))
"""
CONFIG = "etc/pvegpu-lab/pve.json"
HV_DIR = "var/lib/pvegpu-lab/hv"  # the hypervisor's request directory, in the node's root
# The running guest agents' `network-get-interfaces` answers (<vmid>.json), in the node's root.
AGENT_DIR = "var/lib/pvegpu-lab/agent"
NODE_RECORD = "pve-node.json"
# LAB STAND-IN for `pveversion`: the release the pvesh stand-in reports (its default `version`, 9.0.3).
PVEVERSION = """#!/bin/sh
# LAB STAND-IN for Proxmox VE's pveversion (pvegpu lab, lab/pve/node.py).
echo 'pve-manager/9.0.3/0a1b2c3d4e5f6a7b (running kernel: 6.8.12-4-pve)'
"""
GUEST_RECORD = "pve-guest.json"
_HYPERVISOR_TIMEOUT_S = 30.0
CONTAINER_RECORD = "pve-container.json"


def settings(host: hosts.LabHost) -> dict[str, object]:
    """The stand-in's settings for `host` (see lab/pve/pvelib/settings.py)."""
    return {"node": host.name, "sysfs_root": host.sysfs_root, "hypervisor_dir": f"/{HV_DIR}"}


def install(host: hosts.LabHost) -> None:
    modules = host.root / STANDIN_DIR
    modules.mkdir(parents=True, exist_ok=True)
    for library in LIBRARIES:
        shutil.copyfile(library, modules / library.name)
    shutil.rmtree(modules / PACKAGE.name, ignore_errors=True)
    shutil.copytree(PACKAGE, modules / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__"))
    for source, name in ((PVESH, "pvesh"), (PCT, "pct")):
        module = name  # its sibling modules import it by its name
        shutil.copyfile(source, modules / f"{module}.py")
        target = host.root / "usr/bin" / name
        target.write_text(LAUNCHER.format(command=name, directory=STANDIN_DIR, module=module))
        target.chmod(0o755)
    for kind in ("qemu-server", "lxc"):
        link = host.root / "etc/pve" / kind
        if not link.exists() and not link.is_symlink():
            (host.root / "etc/pve/nodes" / host.name / kind).mkdir(parents=True, exist_ok=True)
            link.symlink_to(f"nodes/{host.name}/{kind}")
    config = host.root / CONFIG
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(settings(host), indent=1, sort_keys=True) + "\n")
    (host.root / HV_DIR).mkdir(parents=True, exist_ok=True)
    pveversion = host.root / "usr/bin/pveversion"
    pveversion.write_text(PVEVERSION)
    pveversion.chmod(0o755)
    (host.state_dir / NODE_RECORD).write_text(json.dumps(settings(host), indent=1, sort_keys=True) + "\n")
    api_setup.install(host)


Role = Literal["pve", "guest", "container"]


def role_of(host: hosts.LabHost) -> Role | None:
    """ "pve" for a Proxmox lab node, "guest" for a VM guest and "container" for a CT's container host
    started by one, None for a plain lab host."""
    if (host.state_dir / NODE_RECORD).is_file():
        return "pve"
    if (host.state_dir / GUEST_RECORD).is_file():
        return "guest"
    return "container" if (host.state_dir / CONTAINER_RECORD).is_file() else None


def guest_vm(host: hosts.LabHost) -> dict[str, Any] | None:
    """`{"node": <node name>, "vmid": <int>}` for a VM guest, else None."""
    record = host.state_dir / GUEST_RECORD
    return dict(json.loads(record.read_text())) if record.is_file() else None


def container_ct(host: hosts.LabHost) -> dict[str, Any] | None:
    """`{"node": <node name>, "vmid": <int>}` for a CT's container host, else None."""
    record = host.state_dir / CONTAINER_RECORD
    return dict(json.loads(record.read_text())) if record.is_file() else None


def up(
    name: str, topology: str, mode: hosts.Mode = "netns", guest_mode: hosts.Mode = "nspawn"
) -> hosts.LabHost:
    """Start Proxmox lab node `name`; its VM guests and container hosts will run as `guest_mode` lab hosts.
    Raises LabError like `lab.hosts.up`; a failed start is cleaned up."""
    host = hosts.up(name, topology, mode)
    try:
        install(host)
        api_setup.start(host)
        argv = [sys.executable, "-m", "lab.pve.hypervisor", name, str(host.state_dir)]
        hosts.start_companion(name, [*argv, "--guest-mode", guest_mode])
        _wait_for_images(host)
    except BaseException:
        hosts.down(name)
        raise
    return host


def _wait_for_images(host: hosts.LabHost) -> None:
    """Wait until the hypervisor's image server accepts connections (the hypervisor is then serving)."""
    deadline = time.monotonic() + _HYPERVISOR_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((f"10.200.{host.index}.1", images.PORT), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                log = (host.state_dir / "companion.log").read_text(errors="replace")[-2000:]
                raise LabError(
                    f"{host.name}: the lab hypervisor's image server did not start; its log:\n{log}"
                ) from None
            time.sleep(0.05)


def bios_change(name: str, topology: str) -> hosts.LabHost:
    """What a BIOS change does to lab host `name`: a Proxmox node goes down first (its running VMs stop);
    the firmware renumbers buses and groups (the fake sysfs is rewritten with `topology`); the node boots
    again (the lab's reboot stand-in applies its boot configuration, when a boot layout is installed), and
    starts its `onboot` VMs as pve-guests.service does, through the API's start (the same path as any start:
    the VM's pre-start hookscript, then the mapping check); a start that fails leaves its VM down, its task
    log saying why."""
    host = hosts.get_host(name)
    pve = role_of(host) == "pve"
    if pve:
        for conf in sorted((host.root / "etc/pve/qemu-server").glob("*.conf")):
            path = f"/nodes/{name}/qemu/{conf.stem}/status"
            status = json.loads(_ssh(host, f"pvesh get {path}/current --output-format json"))
            if status["status"] == "running":
                _ssh(host, f"pvesh create {path}/stop")
    host = hosts.retopo(name, topology)
    if (host.root / "usr/local/sbin/reboot").exists():
        _ssh(host, "reboot")  # the reboot stand-in starts the onboot VMs itself
        return host
    if pve:
        for conf in sorted((host.root / "etc/pve/qemu-server").glob("*.conf")):
            path = f"/nodes/{name}/qemu/{conf.stem}"
            config = json.loads(_ssh(host, f"pvesh get {path}/config --output-format json"))
            if config.get("onboot") == 1:
                _ssh(host, f"pvesh create {path}/status/start")
    return host


def _ssh(host: hosts.LabHost, command: str) -> str:
    done = subprocess.run(hosts.ssh_argv(host, command), check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise LabError(f"{host.name}: {command}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout
