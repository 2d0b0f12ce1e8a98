"""Guest config files (/etc/pve/qemu-server/<vmid>.conf, /etc/pve/lxc/<vmid>.conf): parsing and writing
with the pending section, loading a guest's config, typed values, pending changes."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DieError, ParamError
from .guest_schema import config_key_schema
from .jsonschema import P, parse_boolean
from .pmxcfs import sha1

if TYPE_CHECKING:
    from .rest import Call
    from .settings import Settings


@dataclass
class GuestConfig:
    main: dict[str, str]
    pending: dict[str, str]
    raw_lxc: list[tuple[str, str]]
    digest: str


def encode_text(text: str) -> str:
    return "".join(
        c if 0x20 <= ord(c) <= 0x7E and c != ":" else "".join(f"%{b:02X}" for b in c.encode()) for c in text
    )


def decode_text(text: str) -> str:
    return re.sub(r"(%[0-9A-Fa-f]{2})+", lambda m: bytes.fromhex(m.group(0).replace("%", "")).decode(), text)


def parse_guest_config(data: bytes, pending_header: str) -> GuestConfig:
    main: dict[str, str] = {}
    pending: dict[str, str] = {}
    raw: list[tuple[str, str]] = []
    target: dict[str, str] | None = main
    description: list[str] = []
    for line in data.decode().split("\n"):
        if line.startswith("["):
            target = pending if line.strip() == pending_header else None
            continue
        if target is None:
            continue
        if line.startswith("#"):
            if target is main:
                description.append(decode_text(line[1:]))
            continue
        lxc = re.fullmatch(r"(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*", line)
        if lxc and target is main:
            raw.append((lxc.group(1), lxc.group(3)))
            continue
        match = re.fullmatch(r"([a-z][a-z_\-]*\d*):\s*(.+?)\s*", line)
        if match:
            target[match.group(1)] = match.group(2)
    if description:
        main["description"] = "\n".join(description)
    return GuestConfig(main, pending, raw, sha1(data))


def write_guest_config(conf: GuestConfig, pending_header: str) -> str:
    def section(values: dict[str, str]) -> str:
        out = ""
        if "description" in values:
            out += "".join(f"#{encode_text(line)}\n" for line in values["description"].split("\n"))
        out += "".join(f"{k}: {values[k]}\n" for k in sorted(values) if k != "description")
        return out

    text = section(conf.main) + "".join(f"{k}: {v}\n" for k, v in conf.raw_lxc)
    if conf.pending:
        text += f"\n{pending_header}\n" + section(conf.pending)
    return text


QEMU_DIR = "/etc/pve/qemu-server"


LXC_DIR = "/etc/pve/lxc"


def guest_path(call: Call, kind: str) -> Path:
    return call.settings.path(f"{QEMU_DIR if kind == 'qemu' else LXC_DIR}/{call.path_params['vmid']}.conf")


def load_guest(call: Call, kind: str) -> GuestConfig:
    path = guest_path(call, kind)
    if not path.is_file():
        folder = "qemu-server" if kind == "qemu" else "lxc"
        rel = f"nodes/{call.settings.node}/{folder}/{call.path_params['vmid']}.conf"
        raise DieError(f"Configuration file '{rel}' does not exist\n")
    return parse_guest_config(path.read_bytes(), "[PENDING]" if kind == "qemu" else "[pve:pending]")


def typed_values(
    values: dict[str, str], keys: dict[str, P], indexed: dict[str, tuple[int, P]]
) -> dict[str, Any]:
    """Config values as qemu-server/pve-container's check_type returns them: integers and booleans as
    numbers, everything else as strings."""
    result: dict[str, Any] = {}
    for key, value in values.items():
        schema = config_key_schema(key, keys, indexed)
        if schema is not None and schema.type == "integer" and re.fullmatch(r"[+-]?\d+", value):
            result[key] = int(value)
        elif schema is not None and schema.type == "boolean" and parse_boolean(value) is not None:
            result[key] = parse_boolean(value)
        else:
            result[key] = value
    return result


def config_keys(params: dict[str, Any]) -> dict[str, str]:
    skip = {
        "vmid",
        "node",
        "digest",
        "delete",
        "revert",
        "force",
        "skiplock",
    }
    return {k: str(v) for k, v in params.items() if k not in skip}


def pending_deletes(conf: GuestConfig) -> list[str]:
    return [k.lstrip("!") for k in conf.pending.get("delete", "").split(",") if k]


def config_update(call: Call, schema: Callable[[str], P | None]) -> tuple[dict[str, str], list[str]]:
    """A config PUT's keys to set and keys to delete: `no options specified` when there are none, an
    unknown key to delete refused by `schema` (the guest type's key schema)."""
    changes = config_keys(call.params)
    deletes = [k for k in re.split(r"[,;\s]+", call.params.get("delete", "")) if k]
    if not changes and not deletes and not call.params.get("revert"):
        raise DieError("no options specified\n")
    for key in deletes:
        if schema(key) is None:
            raise ParamError({"delete": f"unknown option '{key}'"})
    return changes, deletes


def apply_pending(conf: GuestConfig) -> None:
    for key in pending_deletes(conf):
        conf.main.pop(key, None)
    conf.main.update({k: v for k, v in conf.pending.items() if k != "delete"})
    conf.pending.clear()


def guest_ids(settings: Settings, folder: str) -> list[int]:
    directory = settings.path(folder)
    names = sorted(directory.glob("*.conf")) if directory.is_dir() else []
    return [int(p.stem) for p in names if re.fullmatch(r"[1-9][0-9]{2,8}", p.stem)]
