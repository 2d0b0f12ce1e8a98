"""pyinfra inventory of the lab: every host `python -m lab up` started, as a Proxmox node (group `pve_nodes`).

    python -m lab up node --topology reference
    pyinfra inventory/lab.py deploy/doctor.py

Each host's `node` data declares what its topology was generated with (the GPU model ids and how many cards),
and where its fake sysfs and kernel command line are (`/sys`, `/proc/cmdline`, or /opt/... on nspawn hosts).
SSH: root, with the host's own key; host keys are checked strictly against the lab's known_hosts file, where
the lab records each host's key when it starts it. Run pyinfra from the repository root (it imports `lab`).
"""

from __future__ import annotations

from typing import Any

from lab.hosts import LabHost, known_hosts_path, list_hosts
from pvegpu.models.inventory import exit_on_invalid


def _node(host: LabHost) -> dict[str, Any]:
    manifest = host.manifest()
    devices = manifest["devices"]
    # A card's display function (class 0x03xxxx) carries the GPU model id; its audio function does not.
    functions = [devices[address] for gpu in manifest["gpus"] for address in gpu["functions"]]
    ids = {f"{f['vendor']}:{f['device']}" for f in functions if f["class"].startswith("0x03")}
    return {
        "name": host.name,
        "profile": "vm",
        "gpus": {"ids": sorted(ids), "count": len(manifest["gpus"])},
        "sysfs_root": host.sysfs_root,
        "cmdline_path": host.cmdline_path,
    }


def _ssh(host: LabHost) -> dict[str, Any]:
    return {
        "ssh_hostname": host.address,
        "ssh_port": 22,
        "ssh_user": "root",
        "ssh_key": str(host.key),
        "ssh_known_hosts_file": str(known_hosts_path()),
        "ssh_strict_host_key_checking": "yes",
        "ssh_look_for_keys": False,
        "ssh_allow_agent": False,
        # The user's ~/.ssh/config has no say over lab hosts (a `Host *` Port or User would break them).
        "ssh_config_file": "/dev/null",
    }


_hosts = list_hosts()
if not _hosts:
    raise SystemExit(
        "inventory/lab.py: no lab host is up; start one: python -m lab up node --topology reference"
    )

pve_nodes = exit_on_invalid([(host.name, {"node": _node(host), **_ssh(host)}) for host in _hosts])
