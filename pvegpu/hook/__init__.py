"""The node's pre-start hookscript: a VM start repairs renumber-only drift of its GPU mappings itself.

Proxmox runs a guest's `pre-start` hookscript before it checks the VM's PCI mappings, on every start path
(GUI, `qm start`, the API, `onboot` at boot, HA), and refuses the start when it exits non-zero
(shared/knowledge/proxmox-hookscripts.md). pvegpu's hook reads the node's live PCI hardware with the parser
the facts use (pvegpu/facts/hardware_parse.py), decides with the planner the operator's runs use
(pvegpu/plan/heal.py) and repairs through `pvesh` with the file's digest.

Stdlib only (checked by import-linter): it runs with the node's own python3 (Debian 12: 3.11, 13: 3.13), no
network, from a zipapp that `bundle.py` builds on the operator's machine out of the installed pvegpu package.

- `decide.py`: pure: the VM's config, the mappings and the hardware -> lines to print, repairs, refused;
- `pvesh.py`: the one API call (`pvesh set` with a timeout);
- `main.py`: the entry point Proxmox runs (`<wrapper> <vmid> <phase>`), and `--gauges <vmid>`, which the
  node's gauges timer runs;
- `pre_start.py`: the `pre-start` phase: read, decide, print, repair, the hook's gauges;
- `live_gauges.py`: `--gauges`: read and decide as `pre-start` in `check` mode, write only
  `pvegpu_mappings.prom`;
- `bundle.py`: the zipapp and its wrapper script (operator side).
"""
