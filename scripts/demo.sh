#!/usr/bin/env bash
# scripts/demo.sh - README (a): bring up the lab's Proxmox node and run the main job on it. Run as root.
#
#   bash scripts/demo.sh        install what is missing (lab/bootstrap.sh), (re)start lab host `node` with the
#                               `reference` topology (the 8-GPU box), then: pyinfra inventory/lab.py deploy/doctor.py
#   bash scripts/demo.sh down   stop every lab host
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [[ ${1:-} == down ]]; then
    exec .venv/bin/python -m lab down --all
fi
bash lab/bootstrap.sh
.venv/bin/python -m lab up node --topology reference --replace
exec .venv/bin/pyinfra -y inventory/lab.py deploy/doctor.py
