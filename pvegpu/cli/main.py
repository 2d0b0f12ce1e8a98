"""`pvegpu`: offline views of captured /sys trees, read with the same command and parser the facts use.

Exit status: 0 all selected GPUs passable (with `mapping --against`: every GPU unchanged or repaired); 1 a GPU
refused or a topology problem (count, none found, nodes that disagree; with `--against`: a hardware change
that is not a renumbering); 2 unreadable input (and click's usage errors).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import click

from pvegpu.cli.report import render_table
from pvegpu.facts.hardware_parse import read_hardware_locally  # stdlib parser: no pyinfra import (startup)
from pvegpu.facts.parsing import FactCommandError, ParseError
from pvegpu.facts.pci_cfg import parse_pci_cfg, render_pci_cfg, replace_map_lines
from pvegpu.models.fields import normalize_pci_id
from pvegpu.models.hardware import HostHardware
from pvegpu.models.node import GpuSelector
from pvegpu.models.pve import NODE_NAME, PciMapping
from pvegpu.plan.heal import Status, plan_heal
from pvegpu.plan.mapping import DEFAULT_PREFIX, MappingPlanError, managed_index, mapping_id, plan_mappings
from pvegpu.plan.ownership import mapping_description
from pvegpu.plan.topology import Topology, plan_topology, plan_vendor_topology, topology_to_json

NVIDIA = "10de"
EXIT_REFUSED = 1
EXIT_UNREADABLE = 2
_OWNER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # pve.owner's form


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


# Shared by every command that selects GPUs.
_ID_OPTION = click.option(
    "--id",
    "ids",
    multiple=True,
    callback=_pci_ids,
    metavar="VVVV:DDDD",
    help="GPU model to select (repeatable). Default: every NVIDIA (10de) display function.",
)


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
@_ID_OPTION
@click.option("--count", type=click.IntRange(min=1), help="Number of GPUs expected; another number exits 1.")
def topology(sysfs_root: Path, as_json: bool, ids: tuple[str, ...], count: int | None) -> None:
    """Show the GPUs: cards, IOMMU groups, root buses, NUMA nodes, links, and whether each is passable.

    Exit status 0 when every GPU is passable, 1 when one is refused or the GPUs found are not what was
    expected, 2 when the tree cannot be read.
    """
    planned = _plan(_read(sysfs_root), ids, count)
    if as_json:
        click.echo(json.dumps(topology_to_json(planned), indent=2))
    else:
        click.echo(render_table(planned), nl=False)
    if not planned.ok:
        raise SystemExit(EXIT_REFUSED)


def _nodes(
    _ctx: click.Context, _param: click.Parameter, values: Sequence[str]
) -> tuple[tuple[str, Path], ...]:
    nodes: list[tuple[str, Path]] = []
    for value in values:
        name, sep, directory = value.partition("=")
        if not sep or not directory:
            raise click.BadParameter(f"{value!r} is not NAME=SYSFS_DIR")
        if not NODE_NAME.fullmatch(name):
            raise click.BadParameter(
                f"{name!r} is not a Proxmox node name (letters, digits and hyphens, "
                "starting and ending with a letter or digit)"
            )
        if any(name == seen for seen, _ in nodes):
            raise click.BadParameter(f"node {name} is given twice")
        nodes.append((name, Path(directory)))
    return tuple(nodes)


def _owner(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _OWNER_ID.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not an owner id (letters, digits, - and _)")
    return value


def _prefix(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    try:
        mapping_id(value, 0)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    return value


@main.command()
@click.option(
    "--node",
    "nodes",
    required=True,
    multiple=True,
    callback=_nodes,
    metavar="NAME=SYSFS_DIR",
    help="A cluster node and the sysfs tree read for it (repeatable: one map line per node).",
)
@_ID_OPTION
@click.option("--count", type=click.IntRange(min=1), help="Number of GPUs each node must have.")
@click.option(
    "--prefix",
    default=DEFAULT_PREFIX,
    show_default=True,
    callback=_prefix,
    help="Mapping ids are PREFIX0, PREFIX1, ... in physical order.",
)
@click.option(
    "--single-function",
    "single",
    multiple=True,
    type=click.IntRange(min=0),
    metavar="INDEX",
    help="GPU index mapped by its display function (`path=...:00.0`), as for a GPUDirect clique (vm.p2p); "
    "repeatable, on every node.",
)
@click.option(
    "--against",
    type=click.Path(path_type=Path),
    metavar="PCI_CFG",
    help="A pci.cfg to repair: print it as pvegpu would write it after a BIOS change, one line per GPU on "
    "stderr (--id and --count do not apply: the GPUs are every display function of the mappings' vendors).",
)
@click.option(
    "--owner",
    callback=_owner,
    metavar="ID",
    help="The id in pvegpu's mark (pve.owner, else pve.cluster, else the node's name): the sections carry "
    "`pvegpu-owner: ID` in their description, as pvegpu writes them; with --against only mappings that "
    "carry it are repaired, as the node's hook decides.",
)
def mapping(  # click passes the options by name
    *,
    nodes: tuple[tuple[str, Path], ...],
    ids: tuple[str, ...],
    count: int | None,
    prefix: str,
    single: tuple[int, ...],
    against: Path | None,
    owner: str | None,
) -> None:
    """Print the /etc/pve/mapping/pci.cfg sections pvegpu would write: one mapping per GPU, one map line
    per node, exactly as Proxmox stores them.

    Exit status 0 when printed, 1 when a GPU is refused or the nodes disagree (the problems go to stderr,
    nothing to stdout), 2 when a tree cannot be read.

    With --single-function INDEX: that GPU's map lines name its display function (`0000:41:00.0`), as
    pvegpu writes them for a GPU in a GPUDirect clique (`vm.p2p`): the VM then gets that function alone.

    With --against PCI_CFG: print that file with each node's renumber-only drift repaired (every other line
    byte for byte; a line keeps its shape, whole slot or `.0`), and on stderr one line per GPU and node: `gpu0
    pve1: unchanged`, `gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16, repaired`, or what changed and
    why it is not repaired. A node with any GPU not repaired keeps all its lines. With --owner ID, a
    drifted mapping whose description lacks `pvegpu-owner: ID` is not repaired (`mapping.adopt`); without
    it, marks are not checked. Exit status 0 when every GPU is unchanged or repaired, 1 when a hardware
    change is not a renumbering or a drifted mapping is not pvegpu's, 2 when a tree or the file cannot be
    read.
    """
    if against is not None:
        if ids or count is not None or single:
            raise click.UsageError(
                "--against decides on the GPUs the mappings name, keeping each line's shape: no --id, "
                "--count or --single-function"
            )
        _repair(nodes, against, prefix, owner)
        return
    topologies = {name: _plan(_read(directory), ids, count) for name, directory in nodes}
    try:
        planned = plan_mappings(topologies, prefix, dict.fromkeys(topologies, frozenset(single)))
    except MappingPlanError as error:
        for problem in error.problems:
            click.echo(f"pvegpu: {problem}", err=True)
        raise SystemExit(EXIT_REFUSED) from None
    if owner is not None:
        planned = tuple(replace(m, description=mapping_description(None, owner)) for m in planned)
    click.echo(render_pci_cfg(planned), nl=False)


def _repair(nodes: tuple[tuple[str, Path], ...], against: Path, prefix: str, owner: str | None) -> None:
    text = _read_cfg(against, prefix)
    sections: tuple[PciMapping, ...] = parse_pci_cfg(text, str(against)).mappings
    replacements: dict[tuple[str, str], str] = {}
    ok = True
    for name, directory in sorted(nodes):
        plan = plan_heal(name, sections, _read(directory), prefix, owner)
        for line in plan.lines:
            click.echo(line, err=True)
        for gpu in plan.gpus:
            if gpu.status is Status.REPAIRED and gpu.text is not None and gpu.repaired is not None:
                replacements[gpu.mapping, gpu.text] = gpu.repaired.text
        sections, ok = plan.sections, ok and plan.ok
    click.echo(replace_map_lines(text, replacements), nl=False)
    if not ok:
        raise SystemExit(EXIT_REFUSED)


def _read_cfg(path: Path, prefix: str) -> str:
    """The file's text; exit 2 with `pvegpu: cannot read PATH: <reason>` when it cannot be read, holds no
    pvegpu mapping, or Proxmox would drop lines of one (Proxmox's warnings follow on stderr)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        click.echo(f"pvegpu: cannot read {path}: {getattr(error, 'strerror', None) or error}", err=True)
        raise SystemExit(EXIT_UNREADABLE) from None
    parsed = parse_pci_cfg(text, str(path))
    sections = {*parsed.failed, *(error.section for error in parsed.errors)}
    lost = sorted(section for section in sections if managed_index(prefix, section) is not None)
    if lost:
        click.echo(f"pvegpu: cannot read {path}: Proxmox drops lines of {', '.join(lost)}", err=True)
        for warning in parsed.warnings:
            click.echo(f"pvegpu: {warning}", err=True)
        raise SystemExit(EXIT_UNREADABLE)
    if not any(managed_index(prefix, mapping.id) is not None for mapping in parsed.mappings):
        click.echo(f"pvegpu: cannot read {path}: it holds no mapping {prefix}<N>", err=True)
        raise SystemExit(EXIT_UNREADABLE)
    return text


def _plan(hw: HostHardware, ids: tuple[str, ...], count: int | None) -> Topology:
    if ids:
        return plan_topology(hw, GpuSelector(ids=ids, count=count))
    return plan_vendor_topology(hw, NVIDIA, count)


def _read(sysfs_root: Path) -> HostHardware:
    """The tree's hardware; exit 2 with `pvegpu: cannot read DIR: <reason>` when there is none to plan on."""
    reason = None
    if not sysfs_root.is_dir():
        reason = "no such directory" if not sysfs_root.exists() else "not a directory"
    else:
        try:
            hw = read_hardware_locally(sysfs_root)
        except (FactCommandError, ParseError) as error:
            reason = str(error)
        else:
            if hw.functions:
                return hw
            reason = "no PCI devices under bus/pci/devices (not a sysfs tree?)"
    click.echo(f"pvegpu: cannot read {sysfs_root}: {reason}", err=True)
    raise SystemExit(EXIT_UNREADABLE)
