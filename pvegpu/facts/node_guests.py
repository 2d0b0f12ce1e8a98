"""`NodeGuestList`: what a reboot of the node would stop, in ONE command, read only when pvegpu is about
to reboot the node (never on a no-op run): root's `pvesh get` of `/nodes/<node>/qemu`, `/nodes/<node>/lxc`
and `/cluster/ha/status/current`, each part opened by a line `#pvegpu-guests:<path>`.

As root, not through the inventory's API token: the guest lists hold only the guests the caller has
`VM.Audit` on (qemu-server and pve-container `vmlist`), so a token could miss another admin's VM. The HA
status lists every configured service with the node it is placed on (pve-ha-manager API2/HA/Status.pm:
from the manager status, and resources.cfg for those the CRM has not processed yet), so
`/cluster/ha/resources` (no placement) is not read. A part that fails gives `problem` (the reboot is
refused then), never a fact error. A host without `pvesh` is no Proxmox node: it has no guests to list.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.models.node_guests import HaService, NodeGuest, NodeGuests

MARK = "#pvegpu-guests:"
FAILED = "#pvegpu-guests-failed:"
NO_PVE = "#pvegpu-guests-no-pvesh"
HA_STATUS = "/cluster/ha/status/current"
_SERVICE_KEYS = ("node", "request_state", "state")


def guest_paths(node: str) -> tuple[str, str, str]:
    """The three API paths of the read, in order."""
    return (f"/nodes/{node}/qemu", f"/nodes/{node}/lxc", HA_STATUS)


def node_guests_command(node: str) -> str:
    """The read's POSIX-sh command (module docstring); it exits 0, a failed part says so in its output."""
    paths = " ".join(shlex.quote(path) for path in guest_paths(node))
    return (
        f"if ! command -v pvesh >/dev/null 2>&1; then echo {shlex.quote(NO_PVE)}; else "
        f'for p in {paths}; do echo "{MARK}$p"; '
        f'pvesh get "$p" --output-format json 2>&1 || echo "{FAILED}$?"; done; fi'
    )


def parse_node_guests(lines: Sequence[str]) -> NodeGuests:
    """The read's output -> NodeGuests. Pure; what cannot be read becomes `problem`, naming the path (the
    paths are the markers' own, so the parse needs no node name). No `pvesh` on the host (a plain Debian
    host of the `baremetal` profile): no Proxmox guests, nothing to stop."""
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
    return NodeGuests(tuple(sorted(guests, key=lambda g: g.vmid)), services)


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


def _guests(kind: str, path: str, items: list[object]) -> list[NodeGuest]:
    guests = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("vmid"), int | str):
            raise ValueError(f"pvesh get {path}: an entry without a vmid")
        vmid = int(item["vmid"])
        name = str(item.get("name") or (f"VM {vmid}" if kind == "VM" else f"CT{vmid}"))
        guests.append(NodeGuest("VM" if kind == "VM" else "CT", vmid, name, str(item.get("status", ""))))
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
    """`host.get_fact(NodeGuestList, node=NAME)`: the node's guests and the HA services (module docstring)."""

    @override
    def command(self, node: str) -> str:
        return node_guests_command(node)

    @override
    def process(self, output: list[str]) -> NodeGuests:
        return parse_node_guests(output)
