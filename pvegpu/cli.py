"""`pvegpu`: offline views of a captured /sys tree, read with the same command and parser the facts use.

Exit status: 0 all selected GPUs passable; 1 a GPU refused or a topology problem (count, none found);
2 unreadable input (and click's usage errors).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import click

from pvegpu.facts.errors import FactCommandError, FactParseError
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.fields import normalize_pci_id
from pvegpu.models.hardware import HostHardware
from pvegpu.models.inventory import GpuSelector
from pvegpu.plan.topology import plan_topology, plan_vendor_topology, topology_to_json
from pvegpu.report import render_table

NVIDIA = "10de"
EXIT_REFUSED = 1
EXIT_UNREADABLE = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Plan multi-GPU Proxmox nodes offline, from a captured /sys tree."""


def _pci_ids(_ctx: click.Context, _param: click.Parameter, values: Sequence[str]) -> tuple[str, ...]:
    ids: list[str] = []
    for value in values:
        try:
            pci_id = normalize_pci_id(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None
        if pci_id not in ids:
            ids.append(pci_id)
    return tuple(ids)


@main.command()
@click.option(
    "--sysfs-root",
    required=True,
    type=click.Path(path_type=Path),
    help="Directory holding the sysfs tree (a capture, a lab tree, or /sys).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (docs/topology-json.md) instead of a table."
)
@click.option(
    "--id",
    "ids",
    multiple=True,
    callback=_pci_ids,
    metavar="VVVV:DDDD",
    help="GPU model to select (repeatable). Default: every NVIDIA (10de) display function.",
)
@click.option("--count", type=click.IntRange(min=1), help="Number of GPUs expected; another number exits 1.")
def topology(sysfs_root: Path, as_json: bool, ids: tuple[str, ...], count: int | None) -> None:
    """Show the GPUs: cards, IOMMU groups, root buses, NUMA nodes, links, and whether each is passable.

    Exit status 0 when every GPU is passable, 1 when one is refused or the GPUs found are not what was
    expected, 2 when the tree cannot be read.
    """
    hw = _read(sysfs_root)
    planned = (
        plan_topology(hw, GpuSelector(ids=ids, count=count))
        if ids
        else plan_vendor_topology(hw, NVIDIA, count)
    )
    if as_json:
        click.echo(json.dumps(topology_to_json(planned), indent=2))
    else:
        click.echo(render_table(planned), nl=False)
    if not planned.ok:
        raise SystemExit(EXIT_REFUSED)


def _read(sysfs_root: Path) -> HostHardware:
    """The tree's hardware; exit 2 with `pvegpu: cannot read DIR: <reason>` when there is none to plan on."""
    reason = None
    if not sysfs_root.is_dir():
        reason = "no such directory" if not sysfs_root.exists() else "not a directory"
    else:
        try:
            hw = read_hardware_locally(sysfs_root)
        except (FactCommandError, FactParseError) as error:
            reason = str(error)
        else:
            if hw.functions:
                return hw
            reason = "no PCI devices under bus/pci/devices (not a sysfs tree?)"
    click.echo(f"pvegpu: cannot read {sysfs_root}: {reason}", err=True)
    raise SystemExit(EXIT_UNREADABLE)
