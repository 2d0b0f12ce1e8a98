"""Inventory of a real Proxmox VE node: set the address, the node name and the GPU model, then deploy.

    pyinfra inventory.py deploy/doctor.py

The data is validated when pyinfra loads this file, before it connects anywhere: a problem prints
`<host>: path.to.field: message` and stops the run. The lab has its own inventory (inventory/lab.py).
"""

from pvegpu.models.inventory import exit_on_invalid

pve_nodes = exit_on_invalid(
    [
        (
            "pve1.example.net",
            {
                "ssh_user": "root",
                "node": {
                    "name": "pve1",
                    "profile": "vm",
                    # RTX PRO 6000 Blackwell; `pvegpu topology --sysfs-root /sys` lists what a node has.
                    "gpus": {"ids": ["10de:2bb1"], "count": 8},
                },
            },
        ),
    ]
)
