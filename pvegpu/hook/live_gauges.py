"""The hook's bundle with `--gauges` (main.py): what the node's `pvegpu-gauges.timer` runs every 30 s.

It reads what the pre-start hook reads (the VM's config, /etc/pve/mapping/pci.cfg, the node's PCI hardware:
pre_start.py `read_inputs`), decides per GPU mapping of the VM as the hook would (plan/heal.py, in
`check` mode: nothing is repaired, nothing is written to Proxmox) and writes `pvegpu_mappings.prom`
(pvegpu/plan/gauges.py `mapping_gauges`) atomically. It prints nothing when it wrote the file; when it cannot
read or write it says so in one line on stderr (the unit's journal) and exits 1: the file then keeps the last
check's time, which the staleness alert sees.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pvegpu.hook.decide import PREFIX, Start, mapped_ids
from pvegpu.hook.pre_start import READ_ERRORS, read_inputs, reason, write_textfile
from pvegpu.models.exporter import MAPPINGS_FILE
from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import PciMapping
from pvegpu.plan.gauges import MappingHealth, mapping_gauges, render
from pvegpu.plan.heal import Status, plan_heal
from pvegpu.plan.mapping import managed_index

_STATUS = {Status.UNCHANGED: "valid", Status.REPAIRED: "drift", Status.REFUSED: "changed"}


def mapping_health(
    start: Start, config_text: str, sections: Sequence[PciMapping], hardware: HostHardware
) -> tuple[MappingHealth, ...]:
    """Per `<prefix>N` mapping of the VM's config, in hostpci order: `valid` (the hook's `unchanged`),
    `drift` (a renumbering: the hook's `repaired`, which `repair` mode writes when every managed mapping of
    the node allows it and the mapping carries pvegpu's mark) or `changed` (refused; also a mapping that
    pci.cfg lacks), with the node's map line's address now."""
    ids = [name for name in mapped_ids(config_text) if managed_index(start.prefix, name) is not None]
    if not ids:
        return ()
    plan = plan_heal(start.node, sections, hardware, start.prefix, start.owner)
    gpus = {gpu.mapping: gpu for gpu in plan.gpus}
    found = []
    for mapping in ids:
        gpu = gpus.get(mapping)
        if gpu is None:
            found.append(MappingHealth(mapping, "", "changed"))
            continue
        path = "" if gpu.current is None else gpu.current.path
        found.append(MappingHealth(mapping, path, _STATUS[gpu.status]))
    return tuple(found)


def live_gauges(
    start: Start, pve_root: Path, sysfs_root: Path, timeout_s: float, textfiles: Path | None
) -> int:
    """Check `start`'s VM now and write its file into `textfiles` (None: Debian's directory); the exit
    status (module docstring)."""
    path = Path(MAPPINGS_FILE) if textfiles is None else textfiles / Path(MAPPINGS_FILE).name
    try:
        config, sections, hardware = read_inputs(start.vmid, pve_root, sysfs_root, timeout_s)
    except READ_ERRORS as error:
        print(f"{PREFIX}VM {start.vmid}: mappings not checked ({reason(error)})", file=sys.stderr)
        return 1
    gpus = mapping_health(start, config, sections, hardware)
    content = render(mapping_gauges(start.node, start.vmid, float(int(time.time())), gpus))
    try:
        write_textfile(path, content)
    except OSError as error:
        print(f"{PREFIX}VM {start.vmid}: gauges not written to {path}: {reason(error)}", file=sys.stderr)
        return 1
    return 0
