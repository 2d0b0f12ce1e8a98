"""Inventory of a real Proxmox VE node: set the address, the node name and the GPU model, then deploy.

    pyinfra inventory.py deploy/site.py         # host, mappings + VM, then the guest (group vm_guests)
    pyinfra inventory.py deploy/doctor.py       # read-only report

The data is validated when pyinfra loads this file, before it connects anywhere: a problem prints
`<host>: path.to.field: message` and stops the run. inventory/baremetal.py and inventory/lxc.py reuse these
hosts with another profile; the lab has its own inventory (inventory/lab.py). Every key is described in the
README's variable tables.

SSH host keys are checked strictly against `known_hosts` beside this file, never trusted on first use:
record each host's key there before the first run (README, "Security": compare it with the key the host
shows on its console).
"""

from pathlib import Path

from pvegpu.guest_inventory import exit_on_invalid_guests
from pvegpu.models.inventory import exit_on_invalid

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
                # An API token, read from a 0600 file and never printed.
                "pve": {
                    "backend": "https",
                    "token_id": "pvegpu@pve!deploy",
                    "token_file": "/etc/pvegpu/pve-token",
                },
                # `args` (the OVMF MMIO window) needs root@pam: with a token, use CPU phys-bits instead.
                "vm": {"vmid": 100, "name": "llm", "cores": 64, "memory": 786432, "mmio": "phys-bits"},
                # Declared here so that switching back from the `lxc` profile stops it; add
                # "ssh_public_keys": ["ssh-ed25519 AAAA... you@desk"] so pyinfra can reach it (lxc_guests).
                "lxc": {"vmid": 200, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"},
            },
        ),
    ]
)

# The VM's guest, once it is up: the NVIDIA driver and the SGLang service (deploy/guest.py, deploy/site.py).
vm_guests = exit_on_invalid_guests(
    [
        (
            "llm.example.net",
            {
                **SSH,
                "node": {"name": "llm", "profile": "vm", "gpus": {"ids": ["10de:2bb1"], "count": 8}},
                "sglang": {"model_path": "/srv/models/GLM-5-NVFP4", "served_model_name": "glm-5"},
            },
        ),
    ]
)
