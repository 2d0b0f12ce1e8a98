"""pve-guest-common PVE::Mapping::Dir's checks of a directory mapping (/etc/pve/mapping/directory.cfg; the
file itself: sectionconfig.DIR_MAPPING): a node's directory exists, a node is named once, the entry of the
local node (virtiofs at a VM start, qemu-server QemuServer/Virtiofs.pm). Paths are the node's (its root)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .errors import DieError
from .formats import DIR_MAP_FMT, VIRTIOFS_FMT, verify_dir_path
from .jsonschema import P, parse_boolean, parse_property_string
from .sectionconfig import DIR_MAPPING, Section, mapping_state

if TYPE_CHECKING:
    from .settings import Settings


def parse_dir_entry(text: str) -> dict[str, str]:
    """A `map` entry (`node=<node>,path=<dir>`) by Dir.pm's $map_fmt; ValueError as parse_property_string."""
    return parse_property_string(P(props=DIR_MAP_FMT), text)


def assert_valid(settings: Settings, entry: dict[str, str]) -> None:
    """Dir.pm assert_valid: the entry's path is absolute and an existing directory on this node."""
    path = entry.get("path", "")
    try:
        verify_dir_path(path)
    except ValueError as error:
        raise DieError(str(error)) from None
    local = settings.path(path)
    if not local.exists():
        raise DieError(f"Path {path} does not exist\n")
    if not local.is_dir():
        raise DieError(f"Path {path} exists, but is not a directory\n")


def assert_valid_map_list(settings: Settings, map_list: list[str]) -> None:
    """Dir.pm assert_valid_map_list (create and update): this node's entries checked (assert_valid), then
    each node named at most once (`Node '<node>' is specified <n> times.`)."""
    count: dict[str, int] = {}
    for text in map_list:
        entry = parse_dir_entry(text)
        if entry["node"] == settings.node:
            assert_valid(settings, entry)
        count[entry["node"]] = count.get(entry["node"], 0) + 1
    for node, times in count.items():
        if times > 1:
            raise DieError(f"Node '{node}' is specified {times} times.\n")


def node_entries(section: Section, node: str) -> list[dict[str, str]]:
    """Dir.pm get_node_mapping: the mapping's parseable entries for `node` (a bad one is warned about and
    skipped upstream)."""
    entries = []
    for text in section.map:
        try:
            entry = parse_dir_entry(text)
        except ValueError:
            continue
        if entry.get("node") == node:
            entries.append(entry)
    return entries


def find_on_current_node(settings: Settings, dir_id: str) -> dict[str, str]:
    """Dir.pm find_on_current_node: the one entry of mapping `dir_id` for this node (the texts as upstream,
    its `than than` included)."""
    section = next((s for s in mapping_state(settings, DIR_MAPPING)[0] if s.id == dir_id), None)
    if section is None:
        raise DieError(f"Directory ID {dir_id} does not exist.\n")
    entries = node_entries(section, settings.node)
    if len(entries) > 1:
        raise DieError(f"More than than one directory mapping for node {settings.node}.\n")
    if not entries:
        raise DieError(f"No directory mapping for node {settings.node}.\n")
    return entries[0]


MAX_VIRTIOFS = 10  # Virtiofs.pm $MAX_VIRTIOFS


def _windows(ostype: str | None) -> bool:
    """QemuServer::Helpers::windows_version is not 0."""
    return ostype in ("wxp", "w2k", "w2k3", "w2k8", "wvista") or bool(re.fullmatch(r"win\d+", ostype or ""))


def virtiofs_dirs(settings: Settings, conf: dict[str, str]) -> list[dict[str, Any]]:
    """Virtiofs.pm config's assert_virtiofs_config for each virtiofsN of a starting VM, in index order: the
    mapping's entry for this node (find_on_current_node), no `expose-acl` on Windows, the directory valid
    (`directory mapping invalid: <why>` with the extra newline upstream's `die "...: $@\\n"` adds). Returns
    what the lab hypervisor needs to run virtiofsd: `{"index", "dirid", "path"}` (the node's path)."""
    found = []
    for index in range(MAX_VIRTIOFS):
        value = conf.get(f"virtiofs{index}")
        if not value:
            continue
        virtiofs = parse_property_string(P(props=VIRTIOFS_FMT, default_key="dirid"), value)
        entry = find_on_current_node(settings, virtiofs["dirid"])
        if parse_boolean(virtiofs.get("expose-acl", "0")) and _windows(conf.get("ostype")):
            raise DieError(
                "Please disable ACLs for virtiofs on Windows VMs, otherwise"
                " the virtiofs shared directory cannot be mounted.\n"
            )
        try:
            assert_valid(settings, entry)
        except DieError as error:
            raise DieError(f"directory mapping invalid: {error.text}\n") from None
        found.append({"index": index, "dirid": virtiofs["dirid"], "path": entry["path"]})
    return found
