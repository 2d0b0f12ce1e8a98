"""What the hook does on `pre-start` (main.py says when and why): read, decide, print, repair, and leave its
gauges for the node exporter (`write_gauges`, pvegpu/plan/gauges.py).

main.py imports this module only for that phase, so the other phases exit at once."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

from pvegpu.facts.hardware_parse import read_hardware_locally
from pvegpu.facts.parsing import FactCommandError, ParseError
from pvegpu.facts.pci_cfg import parse_pci_cfg
from pvegpu.hook.decide import PREFIX, Decision, Repair, Start, decide
from pvegpu.hook.pvesh import PveshError, pvesh_set
from pvegpu.models.exporter import HOOK_FILE
from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import PciMapping
from pvegpu.plan.gauges import HookGpu, hook_gauges, render
from pvegpu.plan.heal import GpuHeal, Status

PCI_CFG = "etc/pve/mapping/pci.cfg"
QEMU_CONFIG = "etc/pve/qemu-server/{vmid}.conf"


READ_ERRORS = (OSError, UnicodeDecodeError, FactCommandError, ParseError)


def read_inputs(
    vmid: int, pve_root: Path, sysfs_root: Path, timeout_s: float
) -> tuple[str, tuple[PciMapping, ...], HostHardware]:
    """What the hook decides on: the VM's config text, pci.cfg's mappings (none without the file) and the
    node's PCI hardware. One of `READ_ERRORS` when one cannot be read."""
    config = (pve_root / QEMU_CONFIG.format(vmid=vmid)).read_text(encoding="utf-8")
    cfg = pve_root / PCI_CFG
    text = cfg.read_text(encoding="utf-8") if cfg.exists() else ""
    hardware = read_hardware_locally(sysfs_root, timeout_s=timeout_s)
    return config, tuple(parse_pci_cfg(text).mappings), hardware


def gauges_path(textfiles: Path | None) -> Path:
    """The hook's textfile in directory `textfiles` (None: `HOOK_FILE`, Debian's directory)."""
    return Path(HOOK_FILE) if textfiles is None else textfiles / Path(HOOK_FILE).name


def pre_start(
    start: Start,
    pve_root: Path,
    sysfs_root: Path,
    pvesh: str,
    timeout_s: float,
    *,
    textfiles: Path | None = None,
) -> int:
    """The hook's work for `start` (main.py's docstring); the exit status. `textfiles`: the node exporter's
    textfile directory (`gauges_path`), where the hook's gauges go last (`write_gauges`)."""
    target = gauges_path(textfiles)
    try:
        config, sections, hardware = read_inputs(start.vmid, pve_root, sysfs_root, timeout_s)
    except READ_ERRORS as error:
        _say(f"{PREFIX}VM {start.vmid}: nothing checked ({reason(error)}); Proxmox's own check decides")
        write_gauges(target, start, "unchecked")
        return 0
    decision = decide(start, config, sections, hardware)
    for line in decision.lines:
        _say(line)
    if decision.refused:
        write_gauges(target, start, "refused", _gpus(decision.gpus, written=False))
        return 1
    status = _write(start.vmid, decision, pve_root / PCI_CFG, pvesh, timeout_s)
    result = "refused" if status != 0 else "repaired" if decision.repairs else "valid"
    write_gauges(target, start, result, _gpus(decision.gpus, written=status == 0))
    return status


def _gpus(gpus: Sequence[GpuHeal], *, written: bool) -> tuple[HookGpu, ...]:
    """Each GPU as the hook leaves it: unchanged is healthy, repaired only once its repair is `written`;
    the address is the repaired one then, else the line's."""
    found = []
    for gpu in gpus:
        repaired = gpu.status is Status.REPAIRED and written
        entry = gpu.repaired if repaired else gpu.current
        healthy = gpu.status is Status.UNCHANGED or repaired
        found.append(HookGpu(gpu.mapping, "" if entry is None else entry.path, gpu.status.value, healthy))
    return tuple(found)


def write_gauges(path: Path, start: Start, result: str, gpus: Sequence[HookGpu] = ()) -> None:
    """The hook's textfile (pvegpu/plan/gauges.py `hook_gauges`, the start's time) at `path`, atomically: a
    temporary file in its directory, synced, then renamed over it. Nothing when the directory is missing (no
    node exporter); a write that fails says so in one line, and the start goes on as decided."""
    if not path.parent.is_dir():
        return
    content = render(hook_gauges(start.vmid, start.node, result, float(int(time.time())), gpus))
    try:
        write_textfile(path, content)
    except OSError as error:
        _say(f"{PREFIX}VM {start.vmid}: gauges not written to {path}: {reason(error)}")


def write_textfile(path: Path, content: str) -> None:
    """`content` at `path` (0644), atomically: a temporary file in its directory (`.<name>.pvegpu-new`, not
    a `*.prom` name the node exporter reads), synced, then renamed over it; OSError (the temporary file
    removed) when that fails."""
    temp = path.with_name(f".{path.name}.pvegpu-new")
    try:
        with temp.open("w", encoding="utf-8") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        temp.chmod(0o644)
        temp.replace(path)
    except OSError:
        temp.unlink(missing_ok=True)
        raise


def _write(vmid: int, decision: Decision, pci_cfg: Path, pvesh: str, timeout_s: float) -> int:
    for repair in decision.repairs:
        try:
            _repair(repair, pci_cfg, pvesh, timeout_s)
        except (OSError, UnicodeDecodeError, PveshError) as error:
            _say(
                f"{PREFIX}VM {vmid} not started: {repair.mapping} not repaired: {reason(error)}; nothing "
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


def reason(error: Exception) -> str:
    """An error's text for one line: an OSError's file and message."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return str(error)


def _say(line: str) -> None:
    print(line, flush=True)
