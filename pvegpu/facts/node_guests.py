"""`NodeGuestList`: what a reboot of the node would stop, in ONE command, read only when pvegpu is about
to reboot the node (never on a no-op run): root's `pvesh get` of `/nodes/<node>/qemu`, `/nodes/<node>/lxc`
and `/cluster/ha/status/current`, then the config of each of the inventory's own guests (`own`:
`/nodes/<node>/qemu/<vmid>/config` for `vm.vmid`, `.../lxc/<vmid>/config` for `lxc.vmid`), each part opened
by a line `#pvegpu-guests:<path>`.

As root, not through the inventory's API token: the guest lists hold only the guests the caller has
`VM.Audit` on (qemu-server and pve-container `vmlist`), so a token could miss another admin's VM. The HA
status lists every configured service with the node it is placed on (pve-ha-manager API2/HA/Status.pm:
from the manager status, and resources.cfg for those the CRM has not processed yet), so
`/cluster/ha/resources` (no placement) is not read. A list that fails gives `problem` (the reboot is
refused then), never a fact error. A host without `pvesh` is no Proxmox node: it has no guests to list.

Why the own guests' configs: the lists give each guest's `tags` (qemu-server and pve-container `vmstatus`
copy the config's `tags`), but not its `description`, which holds the `pvegpu-owner: <id>` line of
pvegpu's mark (pvegpu/plan/ownership.py). The tag alone is every inventory's (two inventories managing
one cluster both write `pvegpu`), so only the owner line tells this inventory's guest from another's. The
configs of the one or two guests at the inventory's vmids cost one `pvesh` each, in the same command; a
config that cannot be read (no such guest on the node) leaves that guest's `description` None: not proven
pvegpu's.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import replace

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.models.node_guests import GuestKind, HaService, NodeGuest, NodeGuests

MARK = "#pvegpu-guests:"
FAILED = "#pvegpu-guests-failed:"
NO_PVE = "#pvegpu-guests-no-pvesh"
HA_STATUS = "/cluster/ha/status/current"
_SERVICE_KEYS = ("node", "request_state", "state")
_FOLDERS: dict[GuestKind, str] = {"VM": "qemu", "CT": "lxc"}
_CONFIG = re.compile(r"/nodes/[^/]+/(qemu|lxc)/([0-9]+)/config")


def guest_paths(node: str) -> tuple[str, str, str]:
    """The three list paths of the read, in order."""
    return (f"/nodes/{node}/qemu", f"/nodes/{node}/lxc", HA_STATUS)


def config_path(node: str, kind: GuestKind, vmid: int) -> str:
    """`/nodes/pve1/qemu/100/config` (a VM), `/nodes/pve1/lxc/200/config` (a CT)."""
    return f"/nodes/{node}/{_FOLDERS[kind]}/{vmid}/config"


def node_guests_command(node: str, own: Sequence[tuple[GuestKind, int]] = ()) -> str:
    """The read's POSIX-sh command (module docstring): the lists, then the config of each guest of `own`;
    it exits 0, a failed part says so in its output."""
    configs = (config_path(node, kind, vmid) for kind, vmid in own)
    paths = " ".join(shlex.quote(path) for path in (*guest_paths(node), *configs))
    return (
        f"if ! command -v pvesh >/dev/null 2>&1; then echo {shlex.quote(NO_PVE)}; else "
        f'for p in {paths}; do echo "{MARK}$p"; '
        f'pvesh get "$p" --output-format json 2>&1 || echo "{FAILED}$?"; done; fi'
    )


def parse_node_guests(lines: Sequence[str]) -> NodeGuests:
    """The read's output -> NodeGuests. Pure; a list that cannot be read becomes `problem`, naming the path
    (the paths are the markers' own, so the parse needs no node name); a config read gives its guest's
    `description` (none when it failed). No `pvesh` on the host (a plain Debian host of the `baremetal`
    profile): no Proxmox guests, nothing to stop."""
    if NO_PVE in lines:
        return NodeGuests()
    parts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(MARK):
            current = parts.setdefault(line[len(MARK) :], [])
        elif current is not None:
            current.append(line)
    qemu = next((path for path in parts if path.endswith("/qemu")), "/nodes/<node>/qemu")
    lxc = next((path for path in parts if path.endswith("/lxc")), "/nodes/<node>/lxc")
    try:
        guests = [*_guests("VM", qemu, _json_list(qemu, parts)), *_guests("CT", lxc, _json_list(lxc, parts))]
        services = _services(_json_list(HA_STATUS, parts))
    except ValueError as error:
        return NodeGuests(problem=f"cannot list what a reboot would stop: {error}")
    described = _descriptions(parts)
    guests = [replace(guest, description=described.get((guest.kind, guest.vmid))) for guest in guests]
    return NodeGuests(tuple(sorted(guests, key=lambda g: g.vmid)), services)


def _descriptions(parts: dict[str, list[str]]) -> dict[tuple[GuestKind, int], str]:
    """(kind, vmid) -> the `description` of each config read that answered a JSON object holding one."""
    found: dict[tuple[GuestKind, int], str] = {}
    for path, text in parts.items():
        match = _CONFIG.fullmatch(path)
        if match is None or any(line.startswith(FAILED) for line in text):
            continue
        config = next((line for line in reversed(text) if line.startswith("{")), None)
        try:
            values = json.loads(config) if config is not None else None
        except json.JSONDecodeError:
            continue
        if isinstance(values, dict) and values.get("description") is not None:
            kind: GuestKind = "VM" if match[1] == "qemu" else "CT"
            found[kind, int(match[2])] = str(values["description"])
    return found


def _json_list(path: str, parts: dict[str, list[str]]) -> list[object]:
    if path not in parts:
        raise ValueError(f"pvesh get {path}: no output")
    text = [line for line in parts[path] if line.strip()]
    if any(line.startswith(FAILED) for line in text):
        said = next((line for line in text if not line.startswith(FAILED)), "no message")
        raise ValueError(f"pvesh get {path}: {said}")
    for line in reversed(text):  # warnings on stderr come before the JSON line
        if line.startswith("["):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                break
            if isinstance(data, list):
                return data
    raise ValueError(f"pvesh get {path}: not a JSON list")


def _guests(kind: GuestKind, path: str, items: list[object]) -> list[NodeGuest]:
    guests = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("vmid"), int | str):
            raise ValueError(f"pvesh get {path}: an entry without a vmid")
        vmid = int(item["vmid"])
        name = str(item.get("name") or (f"VM {vmid}" if kind == "VM" else f"CT{vmid}"))
        tags = None if item.get("tags") is None else str(item["tags"])
        guests.append(NodeGuest(kind, vmid, name, str(item.get("status", "")), tags))
    return guests


def _services(items: list[object]) -> tuple[HaService, ...]:
    services = []
    for item in items:
        if not isinstance(item, dict) or item.get("type") != "service":
            continue
        node, request, state = (None if item.get(k) is None else str(item[k]) for k in _SERVICE_KEYS)
        services.append(HaService(str(item.get("sid", "")), node, request, state))
    return tuple(services)


class NodeGuestList(FactBase[NodeGuests]):
    """`host.get_fact(NodeGuestList, node=NAME, own=((KIND, VMID), ...))`: the node's guests, the HA
    services and the descriptions of the `own` guests (module docstring)."""

    @override
    def command(self, node: str, own: tuple[tuple[GuestKind, int], ...] = ()) -> str:
        return node_guests_command(node, own)

    @override
    def process(self, output: list[str]) -> NodeGuests:
        return parse_node_guests(output)
