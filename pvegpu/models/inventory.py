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
import re
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, Tag, ValidationError
from pydantic_core import ErrorDetails, PydanticUndefined

from pvegpu.models.bench import BENCH_KEY, BenchSpec
from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.errors import InventoryError
from pvegpu.models.fields import AbsolutePath, PciId, shown
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.host_keys import host_key_warnings
from pvegpu.models.lxc import LXC_KEY, LxcSpec
from pvegpu.models.mapping import MAPPING_KEY, MappingSpec
from pvegpu.models.pve_api import PVE_KEY, PveApiSpec
from pvegpu.models.root_only_features import root_only_problems
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.vm import VM_KEY, VmSpec

NODE_KEY = "node"
# pyinfra's host data key of the known_hosts file it checks the host's SSH key against.
KNOWN_HOSTS_KEY = "ssh_known_hosts_file"

# Proxmox `pve-node` format (proxmox-pci-mapping.md §2); 63 is the DNS label limit a hostname obeys.
_NODE_NAME = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?")
_NODE_NAME_MAX = 63


def _check_node_name(value: str) -> str:
    if len(value) > _NODE_NAME_MAX:
        raise ValueError(f"must be at most {_NODE_NAME_MAX} characters (got {len(value)})")
    if not _NODE_NAME.fullmatch(value):
        raise ValueError(
            f"{shown(value)} is not a Proxmox node name "
            "(letters, digits and hyphens, starting and ending with a letter or digit)"
        )
    return value


def _check_unique_ids(ids: tuple[str, ...]) -> tuple[str, ...]:
    if not ids:
        raise ValueError("must list at least one vendor:device id")
    seen: set[str] = set()
    for pci_id in ids:
        if pci_id in seen:
            raise ValueError(f"{pci_id} is listed twice")
        seen.add(pci_id)
    return ids


class GpuSelector(BaseModel):
    """Which PCI functions are this node's GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    ids: Annotated[tuple[PciId, ...], AfterValidator(_check_unique_ids)] = Field(
        description=(
            "GPU models as vendor:device ids (4 hex digits each, e.g. `10de:2bb1`); "
            "case-insensitive, stored lowercase. A display function with one of these ids is a GPU."
        ),
    )
    count: StrictInt | None = Field(
        default=None,
        ge=1,
        description="How many GPUs the node must have (another number found is a problem); None: any number.",
    )


class NodeSpec(BaseModel):
    """One Proxmox node (or bare-metal host) and its GPUs: host data key `node`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    name: Annotated[str, AfterValidator(_check_node_name)] = Field(
        description=(
            "Proxmox node name (as `hostname` prints it): letters, digits and hyphens, "
            "starting and ending with a letter or digit, at most 63 characters."
        ),
    )
    profile: Literal["vm", "lxc", "baremetal"] = Field(
        default="vm",
        description=(
            "Where the inference server runs: `vm` (Q35 VM with the GPUs passed through), "
            "`lxc` (container on the host driver) or `baremetal` (the host itself)."
        ),
    )
    gpus: GpuSelector = Field(description="Which PCI functions are this node's GPUs, and how many to expect.")
    sysfs_root: AbsolutePath = Field(
        default="/sys",
        description="Absolute path where the node's sysfs is read (a captured or lab tree in tests).",
    )
    cmdline_path: AbsolutePath = Field(
        default="/proc/cmdline",
        description="Absolute path of the running kernel command line.",
    )


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
}

# How alike (difflib ratio) a host data key and a role key must be to be taken for a misspelling of it:
# `pve_hots`, `nodes`, `sglnag`, `vms`, `Node` are; pyinfra's `ssh_*` and `_*` keys are not.
_NEAR_ROLE_KEY = 0.7

# Host key warnings already printed in this process.
_WARNED: set[str] = set()

HostEntry = str | tuple[str, object]
H = TypeVar("H", bound=Sequence[HostEntry])
SpecT = TypeVar("SpecT", bound=BaseModel)


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


def exit_on_invalid(hosts: H) -> H:
    """Return `hosts` unchanged if valid; else print the problem lines to stderr and exit with status 2.

    For inventory files, so that bad data stops pyinfra before it connects anywhere:
    `pve_hosts = exit_on_invalid([("pve1", {"node": {...}})])`. A valid host whose data turns SSH host key
    checking off gets a warning line on stderr (`pvegpu.models.host_keys`), once per run.
    """
    try:
        validate_inventory(hosts)
    except InventoryError as error:
        for line in error.problems:
            print(line, file=sys.stderr)
        raise SystemExit(2) from None
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
        spec, spec_problems = _validate_spec(key, model, data[key])
        problems.extend(spec_problems)
        if spec is not None:
            validated[key] = spec
    problems.extend(_known_hosts_problems(data, validated.get(VM_KEY)))
    problems.extend(_root_path_problems(data, validated))
    node = validated.get(NODE_KEY)
    return (node if isinstance(node, NodeSpec) and not problems else None), problems


def _known_hosts_problems(data: Mapping[Any, object], vm: BaseModel | None) -> list[str]:
    """A VM made from an image needs the host's `ssh_known_hosts_file`: pvegpu writes the guest's host key
    there and keeps the guest's key pair beside it (pvegpu/guest_keys.py)."""
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
    pve = validated.get(PVE_KEY, PveApiSpec())
    if not isinstance(node, NodeSpec) or not isinstance(pve, PveApiSpec) or PVE_KEY not in data:
        return []
    return root_only_problems(
        node.profile,
        vm if isinstance(vm, VmSpec) else None,
        lxc if isinstance(lxc, LxcSpec) else None,
        pve,
        data.get("ssh_user"),
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


def _validate_spec(key: str, model: type[BaseModel], value: object) -> tuple[BaseModel | None, list[str]]:
    if isinstance(value, model):
        return value, []
    if not isinstance(value, Mapping):
        return None, [f"{key}: must be a mapping (got {shown(value)})"]
    try:
        return model.model_validate(value), []
    except ValidationError as error:
        return None, [_problem_line(key, model, detail) for detail in error.errors()]


class HostDataLike(Protocol):
    """A host's data as roles see it: a mapping, or pyinfra's `host.data` (`get(key, default)`)."""

    def get(self, key: str, default: Any, /) -> Any: ...


def spec_of(data: HostDataLike, key: str, model: type[SpecT]) -> SpecT:
    """The validated spec under `key` of one host's data (roles pass `host.data`; inventories were checked
    already).

    A role key that is absent gets the model's defaults; raises `InventoryError` when the data is invalid.
    """
    spec, problems = _validate_spec(key, model, data.get(key, {}))
    if problems or not isinstance(spec, model):
        raise InventoryError(problems)
    return spec


def _problem_line(key: str, model: type[BaseModel], detail: ErrorDetails) -> str:
    path = ".".join((key, *_data_path(model, detail["loc"])[0]))
    return f"{path}: {_message(model, detail)}"


def _data_path(
    model: type[BaseModel], loc: tuple[int | str, ...]
) -> tuple[list[str], type[BaseModel] | None]:
    """`loc` as the operator's data has it, and the model holding its last field (None: not a model).

    pydantic puts a discriminated union's tag in the location (`image.url.checksum`); the data has no such
    level, so it is left out (`image.checksum`)."""
    parts: list[str] = []
    annotation: Any = model
    holder: type[BaseModel] | None = model
    for part in loc:
        tags = _union_tags(annotation)
        if part in tags:
            annotation = tags[str(part)]
            continue
        parts.append(str(part))
        holder = _model_of(annotation)
        field = None if holder is None else holder.model_fields.get(str(part))
        annotation = None if field is None else field.annotation
    return parts, holder


def _union_tags(annotation: Any) -> dict[str, Any]:
    """The members of a discriminated union (also inside `X | None`) by their tag; empty for other types."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        tag = next((meta.tag for meta in args[1:] if isinstance(meta, Tag)), None)
        return {tag: args[0]} if tag is not None else _union_tags(args[0])
    if origin in (Union, types.UnionType):
        return {tag: member for arg in args for tag, member in _union_tags(arg).items()}
    return {}


def _message(model: type[BaseModel], detail: ErrorDetails) -> str:
    """Rewrite one pydantic error as an operator-facing sentence."""
    kind, ctx = detail["type"], detail.get("ctx", {})
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "extra_forbidden":
        return "unknown field" + _suggestion(model, detail["loc"])
    got = f" (got {shown(detail['input'])})"
    choices = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
    sentences = {
        "missing": "is required",
        "bool_parsing": f"must be true or false{got}",
        "bool_type": f"must be true or false{got}",
        "literal_error": f"must be one of {choices}{got}",
        "string_type": f"must be a string{got}",
        "tuple_type": f"must be a list{got}",
        "int_type": f"must be a whole number{got}",
        "model_type": f"must be a mapping{got}",
        "greater_than_equal": f"must be at least {ctx.get('ge')}{got}",
    }
    return sentences.get(kind, detail["msg"] + got)


def _suggestion(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """` (did you mean 'gpus'?)` when an unknown field is a near miss of a known one."""
    parts, holder = _data_path(model, loc)
    if holder is None:
        return ""
    close = difflib.get_close_matches(parts[-1], list(holder.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def spec_table_markdown(model: type[BaseModel] = NodeSpec, prefix: str = NODE_KEY) -> str:
    """A markdown table (field, type, default, description) of `model`, nested models flattened.

    The README's variable table is generated from this, so descriptions are the documentation.
    """
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    lines.extend(_table_rows(model, prefix))
    return "\n".join(lines) + "\n"


def _table_rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}"
        nested = _model_of(info.annotation)
        if nested is not None:
            rows.extend(_table_rows(nested, path))
            continue
        default = "*required*" if info.default is PydanticUndefined else f"`{info.default}`"
        description = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {_type_name(info.annotation)} | {default} | {description} |")
        for member in _union_tags(info.annotation).values():  # each form's fields, under the same path
            rows.extend(_table_rows(member, path))
    return rows


def _type_name(annotation: Any) -> str:
    """Readable type of a field annotation; refuses shapes it does not know rather than guessing."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return "one of " + ", ".join(f"`{arg}`" for arg in args)
    if origin in (Union, types.UnionType):
        named = [_type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or `None`" if type(None) in args else "")
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"list of {_type_name(args[0])}s"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}"
    return _plain_name(annotation)


def _plain_name(annotation: Any) -> str:
    """A scalar's name, or `mapping (`a`, `b`)` for a form of a tagged union (its fields get rows)."""
    names = {str: "string", int: "integer", bool: "boolean", float: "number"}
    if annotation in names:
        return names[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (" + ", ".join(f"`{name}`" for name in annotation.model_fields) + ")"
    raise TypeError(f"no table type name for {annotation!r}")
