"""Inventory-time validation of serving hosts (VM guests, containers, bare-metal hosts).

`exit_on_invalid_guests(hosts)` is `exit_on_invalid` plus the cross-key checks of `pvegpu.plan.guest`, so
an unknown SGLang flag, a layout that does not fit the GPUs or a driver below the floor stops pyinfra with
exit status 2 and `<host>: <key>.<field>: message` lines, before it connects anywhere.

`guests_of(pve_nodes, data)` derives the guest host of every node whose VM is made from a cloud image
(`vm.image`): named after the VM, reached at its static address or the DHCP address pvegpu recorded, as
`vm.user` with the login key pvegpu generated for it (its files keyed by the node's cluster, node and vmid:
`guest_place`), and the node's SSH settings that are not the node's own (config, known_hosts, strictness).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from pvegpu.inventory.profiles import node_model_sglang
from pvegpu.inventory.validate import KNOWN_HOSTS_KEY, H, HostEntry, exit_on_invalid, stop_on
from pvegpu.local.guest_keys import (
    GuestKeyError,
    GuestPlace,
    address_file,
    adopt_name_keyed_files,
    host_key_files,
    known_host_recorded,
    login_key_files,
    recorded_address,
)
from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.model import MODEL_KEY
from pvegpu.models.node import NODE_KEY, NodeSpec
from pvegpu.models.pve_api import PVE_KEY, PveApiSpec
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.spec_validation import spec_of
from pvegpu.models.vm import VM_KEY, VmSpec
from pvegpu.plan.cloud_init import static_address
from pvegpu.plan.guest import check_guest

# The node's pyinfra SSH settings a guest shares: who connects and how keys are checked, not where to.
SHARED_SSH_KEYS = (
    "ssh_config_file",
    "ssh_look_for_keys",
    "ssh_allow_agent",
    KNOWN_HOSTS_KEY,
    "ssh_strict_host_key_checking",
)
# The guest's pyinfra host name of its node: the guest's roles read the node's plan (its cards, their NUMA
# nodes and links) through it, for the NCCL topology file (pvegpu/plan/nccl_topo.py).
GUEST_OF_KEY = "guest_of"
PROBE_S = 2.0  # how long guests_of waits for a guest's sshd port to open
# What guests_of sets in a guest's data; `data` may add keys, never replace these.
_DERIVED = ("ssh_hostname", "ssh_user", "ssh_key", "_sudo", GUEST_OF_KEY, *SHARED_SSH_KEYS)
# The guest's `node` keys guests_of derives; `data["node"]` may add others (e.g. a `sysfs_root`).
_DERIVED_NODE = ("name", "profile", "gpus")

GuestHost = tuple[str, dict[str, object]]


def exit_on_invalid_guests(hosts: H) -> H:
    """Return `hosts` unchanged if valid; else print every problem line to stderr and exit with status 2."""
    exit_on_invalid(hosts)
    problems: list[str] = []
    for entry in hosts:
        if isinstance(entry, str) or not isinstance(entry[1], Mapping):
            continue
        name, data = entry[0], entry[1]
        problems.extend(
            f"{name}: {problem}"
            for problem in check_guest(
                spec_of(data, NODE_KEY, NodeSpec),
                spec_of(data, DRIVER_KEY, DriverSpec),
                spec_of(data, SGLANG_KEY, SglangSpec),
            )
        )
    stop_on(problems)
    return hosts


def guests_of(pve_nodes: Sequence[HostEntry], data: Mapping[str, object] | None = None) -> list[GuestHost]:
    """The guest host of each node in `pve_nodes` (validated already) whose `vm.image` is set, in order:

        (vm.name, {"ssh_hostname": <static or recorded address>, "ssh_user": vm.user,
                   "ssh_key": <its login key>, ["_sudo": True,]
                   <the node's SHARED_SSH_KEYS>, "guest_of": <the node's host name>,
                   "node": {"name": vm.name, "profile": "vm", "gpus": ...}, **data})

    validated with `exit_on_invalid_guests`. A guest whose host key file does not exist yet (its VM is not
    made by pvegpu yet), whose DHCP address is not recorded yet, whose key is not in known_hosts yet or
    whose sshd does not answer (its VM stopped: a profile switch back to `vm`) is left out, with one
    `info:` line on stderr: the run that creates (or starts) the VM records them, the next run includes it
    (pyinfra opens every host's connection before the first operation). Exit status 2 for two nodes with
    the same VM name, a `data` key guests_of sets itself, an unusable address file, or files of an earlier
    pvegpu (named after the VM) that differ from those at the guest's place (`adopt_name_keyed_files`, which
    moves them there otherwise).
    `data["node"]` adds keys to the guest's `node` (not its name, profile or GPUs, which are the VM's).
    A node with `model` gives its guest's `sglang` the store (pvegpu.inventory.profiles `node_model_sglang`:
    mounted through virtiofs at `sglang.model_path`); `data["sglang"]` must not set what that sets.
    """
    extra = dict(data or {})
    node_extra = dict(cast(Mapping[str, object], extra.pop(NODE_KEY, None) or {}))
    problems = [
        f"guests_of: data key {key!r} is set by guests_of from the node" for key in extra if key in _DERIVED
    ]
    problems += [
        f"guests_of: data key 'node.{key}' is set by guests_of from the node"
        for key in node_extra
        if key in _DERIVED_NODE
    ]
    guests: list[GuestHost] = []
    node_of_guest: dict[str, str] = {}
    for entry in pve_nodes:
        if isinstance(entry, str) or not isinstance(entry[1], Mapping):
            continue
        node_host, node_data = entry[0], entry[1]
        vm = None if node_data.get(VM_KEY) is None else spec_of(node_data, VM_KEY, VmSpec)
        if vm is None or vm.image is None:
            continue
        if vm.name.lower() in node_of_guest:
            first = node_of_guest[vm.name.lower()]
            problems.append(
                f"{node_host}: {VM_KEY}.name: {vm.name!r} is also the VM name of node {first}; "
                "guests_of names each guest host after its VM"
            )
            continue
        node_of_guest[vm.name.lower()] = node_host
        place = guest_place(node_data, vm)
        try:
            adopt_name_keyed_files(Path(str(node_data[KNOWN_HOSTS_KEY])), place, vm.name)
            address = _address(node_host, node_data, vm, place)
        except GuestKeyError as error:
            problems.append(f"{node_host}: {VM_KEY}: {error}")
            continue
        if address is not None:
            guest = {
                **_guest_data(node_data, vm, place, address, node_extra),
                GUEST_OF_KEY: node_host,
                **extra,
            }
            if node_data.get(MODEL_KEY) is not None:
                sglang = cast(Mapping[str, object], extra.get(SGLANG_KEY) or {})
                guest[SGLANG_KEY], model_problems = node_model_sglang(sglang, node_data[MODEL_KEY], "vm")
                problems += [f"{node_host}: guests_of: {problem}" for problem in model_problems]
            guests.append((vm.name, guest))
    stop_on(problems)
    return exit_on_invalid_guests(guests)


def guest_place(node_data: Mapping[str, object], vm: VmSpec) -> GuestPlace:
    """Where the guest of the node with (validated) `node_data` is, for its key and address files: the
    node's `pve.cluster` and `pve.owner`, its `node.name` and `vm.vmid`."""
    pve = spec_of(node_data, PVE_KEY, PveApiSpec)
    return GuestPlace(pve.cluster, pve.owner, spec_of(node_data, NODE_KEY, NodeSpec).name, vm.vmid)


def _address(node_host: str, node_data: Mapping[str, object], vm: VmSpec, place: GuestPlace) -> str | None:
    """The guest's address once pvegpu has made its VM: its key pair exists, its address is known (static,
    or recorded for DHCP) and known_hosts has its key there. Else None, with an info line saying why."""
    known_hosts = Path(str(node_data[KNOWN_HOSTS_KEY]))
    private, public = host_key_files(known_hosts, place)
    address = static_address(vm.ipconfig)
    why = None
    login, _ = login_key_files(known_hosts, place)
    if not (private.exists() and public.exists() and login.exists()):
        why = f"its keys in {private.parent} do not exist yet (made when pvegpu creates the VM)"
    elif address is None and (address := recorded_address(private)) is None:
        why = (
            f"its DHCP address is not recorded yet ({address_file(private)}: written once the guest agent "
            "reports it)"
        )
    elif not known_host_recorded(known_hosts, address, public.read_text().strip()):
        why = f"{known_hosts} has no line with its host key for {address} yet (written once the VM is made)"
    elif not _answers(address):
        why = f"no sshd answers on {address}:22 (its VM is stopped, or still booting)"
    if why is None:
        return address
    print(
        f"info: guest {vm.name} of {node_host} is not in this run's inventory: {why}; "
        "the next run includes it",
        file=sys.stderr,
    )
    return None


def _answers(address: str, port: int = 22) -> bool:
    """Whether an sshd at `address`:22 shows its banner (`SSH-...`) within PROBE_S: pyinfra connects to every
    host before its first operation, and a guest whose VM is stopped (a profile switch back to `vm`, the
    node's run starting it) would fail the whole run there. Nothing is sent; the banner, not an open port,
    counts (a proxy on the way may accept any connection)."""
    try:
        with socket.create_connection((address, port), timeout=PROBE_S) as connection:
            connection.settimeout(PROBE_S)
            return connection.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _guest_data(
    node_data: Mapping[str, object],
    vm: VmSpec,
    place: GuestPlace,
    address: str,
    node_extra: Mapping[str, object],
) -> dict[str, object]:
    gpus = spec_of(node_data, NODE_KEY, NodeSpec).gpus.model_dump(mode="json")
    login, _ = login_key_files(Path(str(node_data[KNOWN_HOSTS_KEY])), place)
    guest: dict[str, object] = {"ssh_hostname": address, "ssh_user": vm.user, "ssh_key": str(login)}
    if vm.user != "root":
        guest["_sudo"] = True
    guest |= {key: node_data[key] for key in SHARED_SSH_KEYS if key in node_data}
    guest[NODE_KEY] = {**node_extra, "name": vm.name, "profile": "vm", "gpus": gpus}
    return guest
