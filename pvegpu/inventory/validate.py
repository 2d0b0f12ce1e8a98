"""What an operator declares about a node: pydantic specs, validated before any host is touched.

Inventory host data carries one namespaced key per role; this module owns `node`:

    ("pve1", {"node": {"name": "pve1", "gpus": {"ids": ["10de:2bb1"], "count": 8}}})

`validate_inventory` checks every host and raises one `InventoryError` listing every problem as
`<host>: path.to.field: message`; `exit_on_invalid` is the form inventory files call at load time. Besides
each spec's own fields: a VM from an image needs the host's known_hosts file, and with an API token and no
root path to the node every feature that writes a root-only key is refused
(pvegpu.models.root_only_features).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from pvegpu.models.bench import BENCH_KEY, BenchSpec
from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.errors import InventoryError
from pvegpu.models.fields import shown
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.host_keys import host_key_warnings
from pvegpu.models.lxc import LXC_KEY, LxcSpec
from pvegpu.models.mapping import MAPPING_KEY, MappingSpec
from pvegpu.models.model import MODEL_KEY, ModelSpec
from pvegpu.models.node import NODE_KEY, NodeSpec
from pvegpu.models.pve_api import PVE_KEY, PveApiSpec
from pvegpu.models.root_only_features import root_only_problems
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.spec_validation import validate_spec
from pvegpu.models.vm import VM_KEY, VmSpec

# pyinfra's host data key of the known_hosts file it checks the host's SSH key against.
KNOWN_HOSTS_KEY = "ssh_known_hosts_file"

# Every role's spec, by its host data key. `node` is required; the others are optional (defaults apply).
# A role that adds a spec registers it here, so inventories validate it before any host is touched.
ROLE_SPECS: dict[str, type[BaseModel]] = {
    NODE_KEY: NodeSpec,
    HOST_KEY: HostSpec,
    SGLANG_KEY: SglangSpec,
    VM_KEY: VmSpec,
    DRIVER_KEY: DriverSpec,
    BENCH_KEY: BenchSpec,
    PVE_KEY: PveApiSpec,
    LXC_KEY: LxcSpec,
    MAPPING_KEY: MappingSpec,
    MODEL_KEY: ModelSpec,
}

# How alike (difflib ratio) a host data key and a role key must be to be taken for a misspelling of it:
# `pve_hots`, `nodes`, `sglnag`, `vms`, `Node` are; pyinfra's `ssh_*` and `_*` keys are not.
_NEAR_ROLE_KEY = 0.7

# Host key warnings already printed in this process.
_WARNED: set[str] = set()

HostEntry = str | tuple[str, object]

H = TypeVar("H", bound=Sequence[HostEntry])


def validate_inventory(hosts: Sequence[HostEntry]) -> list[tuple[str, NodeSpec]]:
    """Validate the `node` data of every host; return `(host, NodeSpec)` in input order.

    `hosts` is a pyinfra inventory list: `(name, data)` tuples, or bare names (which have no data).
    Raises `InventoryError` listing every problem of every host, one `<host>: path: message` line each,
    including a node name declared by two hosts.
    """
    problems: list[str] = []
    specs: list[tuple[str, NodeSpec]] = []
    owner_of_name: dict[str, str] = {}
    for entry in hosts:
        host, data = (entry, {}) if isinstance(entry, str) else entry
        spec, host_problems = _validate_host(data)
        problems.extend(f"{host}: {problem}" for problem in host_problems)
        if spec is None:
            continue
        key = spec.name.lower()  # host names are case-insensitive
        if key in owner_of_name:
            first = owner_of_name[key]
            problems.append(
                f"{host}: {NODE_KEY}.name: {spec.name!r} is already the node name of host {first}"
            )
            continue
        owner_of_name[key] = host
        specs.append((host, spec))
    if problems:
        raise InventoryError(problems)
    return specs


def stop_on(problems: Sequence[str]) -> None:
    """With any problem: each line on stderr, then exit with status 2 (before pyinfra connects anywhere)."""
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        raise SystemExit(2)


def exit_on_invalid(hosts: H) -> H:
    """Return `hosts` unchanged if valid; else print the problem lines to stderr and exit with status 2.

    For inventory files, so that bad data stops pyinfra before it connects anywhere:
    `pve_hosts = exit_on_invalid([("pve1", {"node": {...}})])`. A valid host whose data turns SSH host key
    checking off gets a warning line on stderr (`pvegpu.models.host_keys`), once per run.
    """
    try:
        validate_inventory(hosts)
    except InventoryError as error:
        stop_on(error.problems)
    for warning in host_key_warnings(hosts):
        if warning not in _WARNED:  # inventories validate a host once per group it is in
            _WARNED.add(warning)
            print(warning, file=sys.stderr)
    return hosts


def _validate_host(data: object) -> tuple[NodeSpec | None, list[str]]:
    """The host's NodeSpec (None when invalid) and every problem of every role key in its data."""
    if not isinstance(data, Mapping):
        return None, [f"host data must be a mapping (got {shown(data)})"]
    problems: list[str] = []
    if NODE_KEY not in data:
        problems.append(
            f"{NODE_KEY}: is required (host data needs {NODE_KEY} = {{'name': ..., 'gpus': ...}})"
        )
    problems.extend(_near_role_key_problems(data))
    validated: dict[str, BaseModel] = {}
    for key, model in ROLE_SPECS.items():
        if key not in data:
            continue
        spec, spec_problems = validate_spec(key, model, data[key])
        problems.extend(spec_problems)
        if spec is not None:
            validated[key] = spec
    problems.extend(_known_hosts_problems(data, validated.get(VM_KEY)))
    problems.extend(_root_path_problems(data, validated))
    node = validated.get(NODE_KEY)
    return (node if isinstance(node, NodeSpec) and not problems else None), problems


def _known_hosts_problems(data: Mapping[Any, object], vm: BaseModel | None) -> list[str]:
    """A VM made from an image needs the host's `ssh_known_hosts_file`: pvegpu writes the guest's host key
    there and keeps the guest's key pair beside it (pvegpu/local/guest_keys.py)."""
    if not isinstance(vm, VmSpec) or vm.image is None or data.get(KNOWN_HOSTS_KEY):
        return []
    return [
        f"{VM_KEY}.image: needs the host's {KNOWN_HOSTS_KEY}: pvegpu records the guest's SSH host key there "
        "(strict first contact) and keeps the guest's key pair beside it, in guest-keys/"
    ]


def _root_path_problems(data: Mapping[Any, object], validated: Mapping[str, BaseModel]) -> list[str]:
    """A feature that writes a key only root@pam may set, on an API token without a root path to the node
    (pvegpu.models.root_only_features)."""
    node, vm, lxc = validated.get(NODE_KEY), validated.get(VM_KEY), validated.get(LXC_KEY)
    pve, model = validated.get(PVE_KEY, PveApiSpec()), validated.get(MODEL_KEY)
    if not isinstance(node, NodeSpec) or not isinstance(pve, PveApiSpec) or PVE_KEY not in data:
        return []
    return root_only_problems(
        node.profile,
        vm if isinstance(vm, VmSpec) else None,
        lxc if isinstance(lxc, LxcSpec) else None,
        pve,
        data.get("ssh_user"),
        model=model if isinstance(model, ModelSpec) else None,
    )


def _near_role_key_problems(data: Mapping[Any, object]) -> list[str]:
    """`pve_hots: unknown key (did you mean 'pve_host'?) ...` for each key that is not a role key but reads
    like a misspelled one; pvegpu would silently ignore it, so the operator's settings would never apply.
    Other keys (pyinfra's `ssh_user`, `_sudo`, an operator's own) are left alone."""
    problems = []
    for key in data:
        if not isinstance(key, str) or key in ROLE_SPECS:
            continue
        close = difflib.get_close_matches(key.lower(), list(ROLE_SPECS), n=1, cutoff=_NEAR_ROLE_KEY)
        if close:
            problems.append(
                f"{key}: unknown key (did you mean {close[0]!r}?); pvegpu reads only its role keys "
                f"({', '.join(ROLE_SPECS)})"
            )
    return problems
