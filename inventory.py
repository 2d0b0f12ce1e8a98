"""Inventory of a real Proxmox VE node: set the address, the node name and the GPU model, then deploy.

    pyinfra inventory.py deploy/site.py         # host, mappings + VM from a cloud image, started
    pyinfra inventory.py deploy/site.py         # again: the VM's guest (group vm_guests) serves SGLang
    pyinfra inventory.py deploy/doctor.py       # read-only report

The data is validated when pyinfra loads this file, before it connects anywhere: a problem prints
`<host>: path.to.field: message` and stops the run. inventory/baremetal.py and inventory/lxc.py reuse these
hosts with another profile; the lab has its own inventory (inventory/lab.py). Every key is described in the
README's variable tables.

SSH host keys are checked strictly against `known_hosts` beside this file, never trusted on first use:
record the node's key there before the first run (README, "Security": compare it with the key the host
shows on its console). The VM's guest needs nothing: pvegpu generates its host key and a login key in
`guest-keys/` beside this file (0600), gives them to the guest through cloud-init and writes the host key's
line into `known_hosts`; `guests_of` then lists the guest in `vm_guests`. Two runs from an empty node to
serving: pyinfra connects to every host before its first operation, so the guest, made by the first run,
is served by the second.
"""

from pathlib import Path

from pvegpu.inventory.guests import guests_of
from pvegpu.inventory.validate import exit_on_invalid

# Debian 12's cloud image. `latest/` moves with each build: take the checksum from the SHA512SUMS beside it
# on the day the VM is made (or use a dated build directory). The node keeps the file; later runs never
# download it again.
DEBIAN_12_IMAGE = "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"

# Every host's SSH settings; inventory/baremetal.py and inventory/lxc.py reuse them.
SSH = {
    "ssh_user": "root",
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": str(Path(__file__).resolve().with_name("known_hosts")),
}

pve_nodes = exit_on_invalid(
    [
        (
            "pve1.example.net",
            {
                **SSH,
                "node": {
                    "name": "pve1",
                    "profile": "vm",
                    # RTX PRO 6000 Blackwell; `pvegpu topology --sysfs-root /sys` lists what a node has.
                    "gpus": {"ids": ["10de:2bb1"], "count": 8},
                },
                "pve_host": {"allow_reboot": False},
                # An API token, read from a 0600 file and never printed (README, Security: the `pveum` recipe
                # of its role). Keys only root@pam may set (the pre-start `hookscript`, `args`, `hugepages`,
                # `affinity`) go through root's pvesh on the node over the SSH settings above
                # (`pve.root_ssh`); with "root_ssh": False the features that need them are refused instead.
                "pve": {
                    "backend": "https",
                    "token_id": "pvegpu@pve!deploy",
                    "token_file": "/etc/pvegpu/pve-token",
                    # "owner": "team-a",  # the id in pvegpu's mark (default: `cluster`, else the node name)
                },
                # `vm.mmio` is `args` by default: the OVMF MMIO window sized from the GPUs' BARs, set as root.
                "vm": {
                    "vmid": 100,
                    "name": "llm",
                    "cores": 64,
                    "memory": 786432,
                    # The OS, SGLang's venv and caches: the model is the node's (`model`), read via virtiofs.
                    "disk": {"size_gib": 128},
                    # Downloaded by the node; a wrong checksum stops the run before the VM is made, naming
                    # both sums: replace the zeros with the image's SHA512.
                    "image": {"url": DEBIAN_12_IMAGE, "checksum": "0" * 128, "checksum_algorithm": "sha512"},
                    "ipconfig": "ip=192.0.2.50/24,gw=192.0.2.1",  # or "ip=dhcp": the guest agent reports it
                    # "ssh_public_keys": ["ssh-ed25519 AAAA... you@desk"],  # your own login, besides pvegpu's
                    # A VM at `vmid` that pvegpu did not make (no `pvegpu` tag and `pvegpu-owner:` line) is
                    # refused; "adopt": True takes it over (e.g. your i440FX VM to convert), writing the mark.
                    # "adopt": True,
                },
                # The model's one store on the node, for every profile (README, "The model"): fetched from
                # Hugging Face by the node, resumed after a cut and verified file by file; the VM reads it
                # through virtiofs, the container through a read-only bind mount, bare metal at its path.
                # ~429 GB of GLM-5-NVFP4 with its MTP layer: the free space is checked before the first
                # byte; set "store" to a directory on a file system that holds it (Proxmox's root volume is
                # often smaller). Pin "revision" to a commit to serve the same weights everywhere; a gated
                # repository needs "token_file": "/root/hf-token" (root's 0600 file on the node).
                "model": {
                    "source": {"repo": "festr2/GLM-5-NVFP4-MTP"},
                    # "store": "/tank/models/GLM-5-NVFP4-MTP",  # default /var/lib/pvegpu/models/<name>
                },
                # Declared here so that switching back from the `lxc` profile stops it; add
                # "ssh_public_keys": ["ssh-ed25519 AAAA... you@desk"] so pyinfra can reach it (lxc_guests).
                "lxc": {"vmid": 200, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"},
            },
        ),
    ]
)

# What the VM's guest serves (inventory/baremetal.py and inventory/lxc.py serve it elsewhere): the node's
# `model`, mounted read-only at "model_path" in the guest (the container and bare metal read it at the
# store's path).
SERVING = {
    "sglang": {
        "model_path": "/srv/models/GLM-5-NVFP4-MTP",
        "served_model_name": "glm-5",
    }
}

# The VM's guest, once pvegpu has made it (named after the VM, at its address, as root with its login key):
# the NVIDIA driver and the SGLang service (deploy/guest.py, deploy/site.py).
vm_guests = guests_of(pve_nodes, SERVING)
