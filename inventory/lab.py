"""pyinfra inventory of the lab: every host `python -m lab up` started, as a Proxmox node (group `pve_nodes`),
the guests of the nodes' VMs in group `vm_guests` as inventory.py derives them (`guests_of`: once pvegpu has
made the VM from the lab's stand-in Debian cloud image, reached at its static address with the login and
host keys pvegpu generated), plus any other guest host the lab identifies itself (an installed VM, a test's
own `python -m lab.guest_payload NAME`), and every container host a Proxmox lab node started for a CT
(lab.pve.container) in group `lxc_guests`; guests of both kinds get `driver` and `sglang` data pointing at
their local stand-in sources (lab/guest_payload.py), a container's `node.profile` is `lxc`. Each Proxmox
node under systemd (`--mode nspawn`) keeps the model's one store (`model`), fetched from the stand-in hub its
lab hypervisor serves it (lab/hub.py); its VM guest, its container and the node itself on `baremetal` serve
from that store, as inventory.py's hosts do; other guests serve the stand-in checkpoint the lab put on them.

    python -m lab up node --topology reference
    pyinfra inventory/lab.py deploy/doctor.py

$PVEGPU_PROFILE picks the nodes' profile (`vm` by default; `lxc`, `baremetal`), as inventory/lxc.py and
inventory/baremetal.py do for a real node: `PVEGPU_PROFILE=baremetal pyinfra -y inventory/lab.py
deploy/site.py` switches the lab node to bare metal, `pyinfra -y inventory/lab.py deploy/site.py` back. On
`baremetal` a node serves itself (group `baremetal_hosts`); on `lxc` it declares the container (`lxc`).

Each host's `node` data declares what its topology was generated with (the GPU model ids and how many cards),
and where its fake sysfs and kernel command line are (`/sys`, `/proc/cmdline`, or /opt/... on nspawn hosts).
SSH: root, with the host's own key; host keys are checked strictly against the lab's known_hosts file, where
the lab records each host's key when it starts it.

$PVEGPU_LAB_PVE_BACKEND picks how pvegpu reaches a node's Proxmox API (`pve.backend`): `https` (default, the
shipped inventory's shape: the node's HTTPS API with the API token `pvegpu@pve!deploy`, its secret in the
node's `pve-token` file in the lab's state directory, the node's certificate pinned by fingerprint;
lab/pve/api_setup.py; keys only root@pam may set go through root's pvesh over the node's SSH), `ssh` (root's
pvesh over SSH), or another `pve.backend` value as is.
Run pyinfra from the repository root (it imports `lab`).
"""

from __future__ import annotations

import os
from typing import Any

from lab import guest_payload, hub, images
from lab.hosts import SYSFS_ROOT, LabHost, known_hosts_path, list_hosts
from lab.pve import api_setup
from lab.pve import node as pve_node
from pvegpu.inventory.guests import exit_on_invalid_guests, guests_of
from pvegpu.inventory.profiles import node_model_sglang
from pvegpu.inventory.validate import exit_on_invalid


def _node(host: LabHost, profile: str = "vm") -> dict[str, Any]:
    manifest = host.manifest()
    devices = manifest["devices"]
    # A card's display function (class 0x03xxxx) carries the GPU model id; its audio function does not.
    functions = [devices[address] for gpu in manifest["gpus"] for address in gpu["functions"]]
    ids = {f"{f['vendor']}:{f['device']}" for f in functions if f["class"].startswith("0x03")}
    return {
        "name": host.name,
        "profile": profile,
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


def _is_guest(host: LabHost) -> bool:
    return host.topology.startswith(("q35-", "i440fx-"))  # lab.pve.guest names its topologies so


def _is_cloud_guest(host: LabHost) -> bool:
    """A guest cloud-init set up: its host key is pvegpu's, not the lab's (guests_of lists it)."""
    return _is_guest(host) and not host.host_key_recorded


def _is_container(host: LabHost) -> bool:
    return pve_node.role_of(host) == "container"


# Guests get their driver and SGLang from the stand-in apt repository and wheel copied into them.
GUEST_DATA: dict[str, Any] = {
    "driver": {"repository": guest_payload.REPOSITORY_URL, "version_file": guest_payload.VERSION_FILE},
    "sglang": {
        "pip_args": ["--no-index", "--find-links", guest_payload.WHEEL_DIR],
        "start_timeout_s": 60,
        "model_path": guest_payload.CHECKPOINT_DIR,  # the stand-in checkpoint: the recipe applies
    },
}

# Proxmox lab nodes (`python -m lab up NAME --pve`) get a VM and reach the Proxmox stand-in's API as
# PVE_BACKEND says (_pve_api): by default its HTTPS API with the token, root-only keys through root's pvesh.
# The lab's reboot is a stand-in (lab/boot.py) that applies the written boot configuration, so it is allowed.
# A node's own driver (profiles `lxc`, `baremetal`) comes from the same stand-in repository, reboot allowed.
PVE_DATA: dict[str, Any] = {
    "pve_host": {"allow_reboot": True},
    "driver": {**GUEST_DATA["driver"], "allow_reboot": True},
}
PVE_BACKEND = os.environ.get("PVEGPU_LAB_PVE_BACKEND", "https")


def _pve_api(host: LabHost) -> dict[str, Any]:
    """The node's `pve` data for PVE_BACKEND: https names the token, its file and the pinned certificate."""
    api = api_setup.record(host) if PVE_BACKEND == "https" else None
    if api is None:
        return {"backend": PVE_BACKEND}
    return {
        "backend": "https",
        "token_id": api["token_id"],
        "token_file": api["token_file"],
        "fingerprint": api["fingerprint"],
    }


IMAGE = "debian-12-genericcloud-amd64.qcow2"
VMID = 100


def _vm(host: LabHost) -> dict[str, Any]:
    """The node's VM: named as the lab names its guest host, made from the stand-in Debian cloud image the
    node downloads from the lab's image server, at a static lab address of its own (lab.cloud_init)."""
    net = host.index + 100
    return {
        "vmid": VMID,
        "name": f"{host.name}v{VMID}",
        "cores": 4,
        "memory": 8192,
        "disk": {"size_gib": 32},
        "image": {"url": images.image_url(host, IMAGE), "checksum": images.image_checksum(IMAGE)},
        "ipconfig": f"ip=10.200.{net}.2/24,gw=10.200.{net}.1",
    }


CONTAINER: dict[str, Any] = {
    "vmid": 200,
    "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
}
PROFILE = os.environ.get("PVEGPU_PROFILE", "vm")


def _model(node: LabHost) -> dict[str, Any]:
    """The node's model store (`model`): fetched from the stand-in hub its lab hypervisor serves it at its
    own gateway (lab/hub.py), as a real node fetches it from Hugging Face, into the default store."""
    source = {"repo": hub.REPO, "endpoint": hub.node_endpoint(node), "token_file": hub.TOKEN_FILE}
    return {"source": source, "pip_args": GUEST_DATA["sglang"]["pip_args"]}


def _serving(node: LabHost, profile: str) -> dict[str, Any]:
    """A serving host's `sglang` on `profile`: the node's store (when it has one, _pve), as inventory.py's
    hosts get it."""
    model = _model(node) if node.mode == "nspawn" else None
    sglang, problems = node_model_sglang(GUEST_DATA["sglang"], model, profile)
    assert not problems, problems
    return sglang


def _pve(host: LabHost) -> dict[str, Any]:
    if pve_node.role_of(host) != "pve":
        return {}
    serving = {"sglang": _serving(host, "baremetal")} if PROFILE == "baremetal" else {}
    container = {"lxc": CONTAINER} if PROFILE == "lxc" else {}
    # The model store's fetch runs as a systemd unit: a node started without systemd as PID 1 (`--mode netns`,
    # the tier's quick nodes for the other roles) declares none; a real node always runs systemd.
    model = {"model": _model(host)} if host.mode == "nspawn" else {}
    return {**PVE_DATA, "pve": _pve_api(host), "vm": _vm(host), **model, **serving, **container}


pve_nodes = exit_on_invalid(
    [
        (host.name, {"node": _node(host, PROFILE), **_pve(host), **_ssh(host)})
        for host in _hosts
        if not _is_guest(host) and not _is_container(host)
    ]
)
# On `baremetal` the Proxmox lab nodes serve themselves.
baremetal_hosts = exit_on_invalid_guests([(name, data) for name, data in pve_nodes if "sglang" in data])
# As inventory.py, inventory/lxc.py and inventory/baremetal.py do: the VMs' guests serve on `vm`, the
# containers on `lxc` (a guest of the profile not in use is stopped by the switch).
_by_name = {host.name: host for host in _hosts}


# Where a node's VM guest mounts the node's store (guests_of: `sglang.model_share` virtiofs), as inventory.py.
SHARED_MODEL = "/srv/models/GLM-5-NVFP4-MTP"
_SHARED = {**GUEST_DATA, "sglang": {**GUEST_DATA["sglang"], "model_path": SHARED_MODEL}}
vm_guests = (
    [
        # A cloud-init guest runs under systemd-nspawn: its fake sysfs is where lab.hosts puts it then.
        *guests_of(pve_nodes, {**_SHARED, "node": {"sysfs_root": SYSFS_ROOT["nspawn"]}}),
        *exit_on_invalid_guests(
            [
                (host.name, {"node": _node(host), **GUEST_DATA, **_ssh(host)})
                for host in _hosts
                if _is_guest(host) and not _is_cloud_guest(host)
            ]
        ),
    ]
    if PROFILE == "vm"
    else []
)
lxc_guests = exit_on_invalid_guests(
    [
        (
            host.name,
            {
                "node": _node(host, "lxc"),
                **GUEST_DATA,
                "sglang": _serving(_by_name[(pve_node.container_ct(host) or {})["node"]], "lxc"),
                **_ssh(host),
            },
        )
        for host in _hosts
        if _is_container(host) and PROFILE == "lxc"
    ]
)
