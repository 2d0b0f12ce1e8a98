#!/usr/bin/env bash
# scripts/demo.sh - README (a): bring up the lab's Proxmox node and run the main job on it. Run as root.
#
#   bash scripts/demo.sh        install what is missing (lab/bootstrap.sh), (re)start the lab's Proxmox node
#                               (the 8-GPU `reference` box under real systemd, GRUB, pvesh stand-in), then:
#                                 1. pyinfra inventory/lab.py deploy/site.py    host prepared (IOMMU tokens, vfio,
#                                    lab reboot), PCI mappings, the Q35 VM created and started: its guest comes up
#                                 2. pyinfra inventory/lab.py deploy/site.py    the inventory now has the guest:
#                                    NVIDIA driver + SGLang there (lab stand-ins); nothing changes on the node
#                                 3. pyinfra inventory/lab.py deploy/doctor.py  topology, host checks, NCCL transports
#   bash scripts/demo.sh down   stop every lab host (the node, its VM guest)
#
# The node is named `node` ($PVEGPU_LAB_NODE overrides it: the tests give theirs another name, so a demo left
# running and the tests never meet).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [[ ${1:-} == down ]]; then
    exec .venv/bin/python -m lab down --all
fi
say() { printf '\n=== %s\n' "$*"; }
bash lab/bootstrap.sh
.venv/bin/python -m lab up "${PVEGPU_LAB_NODE:-node}" --topology reference --pve --boot grub --mode nspawn --replace
say "1/3 deploy/site.py: the Proxmox node (host, mappings, VM)"
.venv/bin/pyinfra -y inventory/lab.py deploy/site.py
say "2/3 deploy/site.py again: the VM's guest (driver, SGLang); the node reports no change"
.venv/bin/pyinfra -y inventory/lab.py deploy/site.py
say "3/3 deploy/doctor.py: read-only report"
.venv/bin/pyinfra -y inventory/lab.py deploy/doctor.py
