"""What the pre-start hook does for one VM start, decided from what it read. Pure.

`decide(start, config_text, sections, hardware)` takes the VM's config file text (only its current section
counts: the `hostpciN: mapping=<id>` keys), the mappings of /etc/pve/mapping/pci.cfg and the node's live PCI
hardware, and decides with `plan_heal` (the node's whole set of managed mappings, so positions are
compared over every card) for the GPUs this VM maps:

- all valid: one line, nothing to write, the start goes on;
- renumber-only drift (`repair`): one line per GPU (`pvegpu: gpu3 pve1: 0000:71:00 group 23 -> 0000:72:00
  group 41, repaired`) and one `Repair` per drifted mapping: its whole `map` before and after (the other
  nodes' lines verbatim); the start goes on once they are written. A repaired line keeps its path's shape:
  a GPU mapped single-function for a GPUDirect clique (`0000:71:00.0`, plan/mapping.py) stays so, since the
  clique parts of the VM's `args` address its device `hostpciN` (plan/p2p.py), which a whole slot would
  rename `hostpciN.0`; `pvegpu mapping --against` repairs alike (both are plan/heal.py);
- renumber-only drift (`check`): what each repair would be, nothing to write, refused;
- renumber-only drift of a mapping without pvegpu's mark for `Start.owner` (its description lacks
  `pvegpu-owner: <owner>`, plan/ownership.py): pvegpu repairs only its own mappings, so nothing is
  repaired; one line per GPU, the unmarked one's naming it and `mapping.adopt` (`pvegpu: gpu3 pve1:
  0000:71:00 group 23 -> 0000:72:00 group 41 is a renumbering, but mapping gpu3 is not pvegpu's (no
  pvegpu mark; mapping.adopt: true adopts it), not repaired`), then the fix; refused;
- anything else: per GPU what changed and why it is not repaired, then the fix command; refused.
Every line printed starts with `pvegpu: `.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import PciMapping
from pvegpu.plan.heal import GpuHeal, Status, plan_heal
from pvegpu.plan.mapping import managed_index
from pvegpu.plan.ownership import MAPPING_SWITCH

FIX_COMMAND = "pyinfra inventory.py deploy/rebuild_vm.py"
PREFIX = "pvegpu: "
_HOSTPCI = re.compile(r"hostpci\d+")


class Mode(StrEnum):
    """`vm.self_heal` as the hook sees it (`off` installs no hook)."""

    REPAIR = "repair"
    CHECK = "check"


@dataclass(frozen=True)
class Start:
    """One start: the VM, the node it starts on, `vm.self_heal`, `vm.mapping_prefix` and the id in pvegpu's
    mark (`owner`, plan/ownership.py `owner_id`): only mappings marked with it are repaired."""

    vmid: int
    node: str
    mode: Mode
    prefix: str
    owner: str


@dataclass(frozen=True)
class Repair:
    """Mapping `mapping`'s whole `map` as read (`old`) and as it is to be written (`new`)."""

    mapping: str
    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    """`lines` to print (task log), `repairs` to write before the start goes on, `refused`: exit 1; `gpus`:
    the decision per GPU mapping of the VM (its gauges, pvegpu/plan/gauges.py)."""

    lines: tuple[str, ...]
    repairs: tuple[Repair, ...]
    refused: bool
    gpus: tuple[GpuHeal, ...] = field(default=(), compare=False)  # detail of `lines`: not compared


def mapped_ids(config_text: str) -> tuple[str, ...]:
    """The mapping ids of the `hostpciN: mapping=<id>,...` keys of a qemu-server config's current section
    (snapshots and `[PENDING]` follow the first `[` line), in hostpci order."""
    found: list[tuple[int, str]] = []
    for line in config_text.split("\n"):
        if line.startswith("["):
            break
        key, sep, value = line.partition(":")
        if not sep or not _HOSTPCI.fullmatch(key):
            continue
        options = {}
        for part in value.strip().split(","):
            name, has_value, option = part.partition("=")
            options[name if has_value else "host"] = option if has_value else name
        if "mapping" in options:
            found.append((int(key[len("hostpci") :]), options["mapping"]))
    return tuple(mapping for _, mapping in sorted(found))


def decide(
    start: Start, config_text: str, sections: Sequence[PciMapping], hardware: HostHardware
) -> Decision:
    """The hook's decision for `start` (module docstring)."""
    vm = f"VM {start.vmid}"
    ids = [name for name in mapped_ids(config_text) if managed_index(start.prefix, name) is not None]
    if not ids:
        return Decision((f"{PREFIX}{vm} maps no {start.prefix}<N> mapping: nothing to check",), (), False)
    plan = plan_heal(start.node, sections, hardware, start.prefix, start.owner)
    gpus = [gpu for gpu in plan.gpus if gpu.mapping in ids]
    unknown = [name for name in ids if name not in {gpu.mapping for gpu in gpus}]
    if unknown:
        missing = ", ".join(unknown)
        return Decision((f"{PREFIX}{vm}: no mapping {missing} in pci.cfg; run: {FIX_COMMAND}",), (), True)
    drifted = [gpu for gpu in gpus if gpu.status is Status.REPAIRED]
    if plan.ok and not drifted:
        valid = f"{PREFIX}{vm} on {start.node}: {len(gpus)} GPU mappings valid"
        return Decision((valid,), (), False, tuple(gpus))
    if plan.ok and start.mode is Mode.REPAIR:
        old = {section.id: section.map for section in sections}
        repairs = tuple(
            Repair(section.id, old[section.id], section.map)
            for section in plan.sections
            if section.id in {gpu.mapping for gpu in drifted}
        )
        return Decision(tuple(PREFIX + gpu.line for gpu in gpus), repairs, False, tuple(gpus))
    if plan.ok:
        lines = [PREFIX + gpu.finding for gpu in gpus]
        lines.append(
            f"{PREFIX}{vm} not started: vm.self_heal is check, so nothing is written; to repair, run: "
            f"{FIX_COMMAND}"
        )
        return Decision(tuple(lines), (), True, tuple(gpus))
    lines = [PREFIX + gpu.line for gpu in gpus]
    lines.extend(f"{PREFIX}{start.node}: {sentence}, not repaired" for sentence in plan.added)
    if plan.hardware_changed:
        lines.append(
            f"{PREFIX}{vm} not started: the GPUs of {start.node} changed, not only their numbers; check the "
            f"hardware, then run: {FIX_COMMAND}"
        )
    else:
        one = len(plan.unowned) == 1
        lines.append(
            f"{PREFIX}{vm} not started: pvegpu repairs only its own mappings, and {', '.join(plan.unowned)} "
            f"{'lacks' if one else 'lack'} its mark; to let pvegpu repair {'it' if one else 'them'}, set "
            f"{MAPPING_SWITCH}: true, then run: {FIX_COMMAND}"
        )
    return Decision(tuple(lines), (), True, tuple(gpus))
