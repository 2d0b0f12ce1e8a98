"""Test oracle: Proxmox's live mapping check (PVE::Mapping::PCI::assert_valid) against a node. Pure.

Proxmox runs it at every VM start and for `GET /cluster/mapping/pci?check-node=N`
(shared/knowledge/proxmox-pci-mapping.md §3, proxmox-api-behaviour.md §3 and §4.7). For each
`;`-separated path of an entry, with index idx:

1. a path without a function gets `.0` (the whole slot is mapped; function 0's attributes are checked);
2. a function the node does not have: `pci device '<path>' not found`;
3. expected = {id, iommugroup (only for idx 0), subsystem-id, mdev}; configured = the entry's id,
   iommugroup, subsystem-id and the section's mdev (0 when unset). For every key, sorted:
   neither side set -> ok; hardware only -> `missing expected property '<k>' for device '<path>'`;
   entry only -> `unexpected property '<k>' configured for device '<path>'`; else `0x` is removed from
   both and they are compared as strings -> `'<k>' does not match for '<mapping id>' (<hw> != <cfg>)`.

`HostHardware` does not record `mdev_supported_types`, so the hardware counts as offering no mediated
devices (true of every passthrough GPU pvegpu maps): a section with `mdev 1` fails on `'mdev'`.
"""

from __future__ import annotations

from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import MapEntry, MapEntryError, MappingCheck, PciMapping, Severity, parse_map_entry


class MappingInvalidError(ValueError):
    """The entry does not describe the node's hardware; the message is Proxmox's (without its `\\n`)."""


def assert_valid(name: str, entry: MapEntry, hw: HostHardware, section: PciMapping | None = None) -> None:
    """Raise MappingInvalidError with Proxmox's message when `entry` of mapping `name` fails on `hw`.

    With `section` given (as at VM start and in the API check) its `mdev` is compared too.
    """
    for index, path in enumerate(entry.paths):
        address = path if "." in path.rsplit(":", 1)[-1] else f"{path}.0"
        function = hw.by_address.get(address)
        if function is None:
            raise MappingInvalidError(f"pci device '{address}' not found")
        expected: dict[str, str | None] = {
            "id": function.id,
            "iommugroup": None if function.iommu_group is None else str(function.iommu_group),
            "subsystem-id": function.subsystem_id,
        }
        configured: dict[str, str | None] = {
            "id": entry.id,
            "iommugroup": None if entry.iommugroup is None else str(entry.iommugroup),
            "subsystem-id": entry.subsystem_id,
        }
        if section is not None:
            expected["mdev"] = "0"
            configured["mdev"] = "1" if section.mdev else "0"
        for key in sorted(expected):
            if key == "iommugroup" and index > 0:
                continue
            _compare(name, address, key, expected[key], configured[key])


def _compare(name: str, address: str, key: str, hardware: str | None, config: str | None) -> None:
    if hardware is None and config is None:
        return
    if config is None:
        raise MappingInvalidError(f"missing expected property '{key}' for device '{address}'")
    if hardware is None:
        raise MappingInvalidError(f"unexpected property '{key}' configured for device '{address}'")
    hardware, config = hardware.replace("0x", ""), config.replace("0x", "")
    if hardware != config:
        raise MappingInvalidError(f"'{key}' does not match for '{name}' ({hardware} != {config})")


def check_node(mapping: PciMapping, node: str, hw: HostHardware) -> tuple[MappingCheck, ...]:
    """The `checks` list `GET /cluster/mapping/pci?check-node=<node>` gives `mapping` on `hw`.

    No entry for the node: one warning `No mapping for node <node>.`; every entry of the node that fails:
    an error `Invalid configuration: <message>\\n` (the message keeps its newline). Empty means valid.
    Entries that do not parse are skipped: Proxmox dropped them when it read the file.
    """
    entries = []
    for text in mapping.map:
        try:
            entries.append(parse_map_entry(text))
        except MapEntryError:
            continue
    mine = [entry for entry in entries if entry.node == node]
    if not mine:
        return (MappingCheck(Severity.WARNING, f"No mapping for node {node}."),)
    checks = []
    for entry in mine:
        try:
            assert_valid(mapping.id, entry, hw, mapping)
        except MappingInvalidError as invalid:
            checks.append(MappingCheck(Severity.ERROR, f"Invalid configuration: {invalid}\n"))
    return tuple(checks)
