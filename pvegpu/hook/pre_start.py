"""What the hook does on `pre-start` (main.py says when and why): read, decide, print, repair.

main.py imports this module only for that phase, so the other phases exit at once."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pvegpu.facts.hardware_parse import read_hardware_locally
from pvegpu.facts.parsing import FactCommandError, ParseError
from pvegpu.facts.pci_cfg import parse_pci_cfg
from pvegpu.hook.decide import PREFIX, Decision, Repair, Start, decide
from pvegpu.hook.pvesh import PveshError, pvesh_set

PCI_CFG = "etc/pve/mapping/pci.cfg"
QEMU_CONFIG = "etc/pve/qemu-server/{vmid}.conf"


def pre_start(start: Start, pve_root: Path, sysfs_root: Path, pvesh: str, timeout_s: float) -> int:
    """The hook's work for `start` (main.py's docstring); the exit status."""
    try:
        config = (pve_root / QEMU_CONFIG.format(vmid=start.vmid)).read_text(encoding="utf-8")
        cfg = pve_root / PCI_CFG
        text = cfg.read_text(encoding="utf-8") if cfg.exists() else ""
        hardware = read_hardware_locally(sysfs_root, timeout_s=timeout_s)
    except (OSError, UnicodeDecodeError, FactCommandError, ParseError) as error:
        _say(f"{PREFIX}VM {start.vmid}: nothing checked ({_reason(error)}); Proxmox's own check decides")
        return 0
    decision = decide(start, config, parse_pci_cfg(text).mappings, hardware)
    for line in decision.lines:
        _say(line)
    if decision.refused:
        return 1
    return _write(start.vmid, decision, pve_root / PCI_CFG, pvesh, timeout_s)


def _write(vmid: int, decision: Decision, pci_cfg: Path, pvesh: str, timeout_s: float) -> int:
    for repair in decision.repairs:
        try:
            _repair(repair, pci_cfg, pvesh, timeout_s)
        except (OSError, UnicodeDecodeError, PveshError) as error:
            _say(
                f"{PREFIX}VM {vmid} not started: {repair.mapping} not repaired: {_reason(error)}; nothing "
                "was overwritten, the next start decides again"
            )
            return 1
    return 0


def _repair(repair: Repair, pci_cfg: Path, pvesh: str, timeout_s: float) -> None:
    data = pci_cfg.read_bytes()
    now = {mapping.id: mapping.map for mapping in parse_pci_cfg(data.decode("utf-8")).mappings}
    if now.get(repair.mapping) != repair.old:
        raise PveshError("its map changed since the hook read it (a concurrent edit)")
    options = [*(("map", line) for line in repair.new), ("digest", hashlib.sha1(data).hexdigest())]
    pvesh_set(f"/cluster/mapping/pci/{repair.mapping}", options, timeout_s, pvesh)


def _reason(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return str(error)


def _say(line: str) -> None:
    print(line, flush=True)
