"""The API's answers read into pvegpu's models; an answer of the wrong JSON shape is a `ShapeError`."""

from __future__ import annotations

import re

from pvegpu.models.pve import (
    BackupJob,
    GuestConfig,
    MappingCheck,
    MappingState,
    PciMapping,
    ReplicationJob,
    Severity,
    VmStatus,
)
from pvegpu.pve.errors import PveResponseError
from pvegpu.pve.transport import Value


class ShapeError(ValueError):
    """Data of the wrong JSON shape; `expected` says what was wanted (`a list`)."""

    def __init__(self, expected: str) -> None:
        self.expected = expected
        super().__init__(expected)


def response_error(endpoint: str, expected: str, got: object) -> PveResponseError:
    error = PveResponseError(expected, got)
    error.endpoint = endpoint
    return error


def mapping_params(mapping: PciMapping) -> dict[str, Value | None]:
    def bit(value: bool | None) -> int | None:
        return None if value is None else int(value)

    return {
        "map": list(mapping.map),
        "description": mapping.description,
        "mdev": bit(mapping.mdev),
        "live-migration-capable": bit(mapping.live_migration_capable),
    }


def mapping_state(item: object, *, checked: bool) -> MappingState:
    data = answer_dict(item)
    description = data.get("description")
    mapping = PciMapping(
        id=text_of(data, "id"),
        map=tuple(answer_strings(data.get("map", []))),
        description=None if description is None else str(description),
        mdev=answer_flag(data.get("mdev")),
        live_migration_capable=answer_flag(data.get("live-migration-capable")),
    )
    checks = None
    if checked:
        checks = tuple(
            MappingCheck(Severity(text_of(c, "severity")), text_of(c, "message"))
            for c in answer_list(data.get("checks", []))
        )
    return MappingState(mapping=mapping, digest=text_of(data, "digest"), checks=checks)


def vm_status(data: object) -> VmStatus:
    values = answer_dict(data)
    qmp, name = values.get("qmpstatus"), values.get("name")
    vmid = values["vmid"]
    if not isinstance(vmid, int | str) or not str(vmid).isdigit():
        raise ShapeError("an integer 'vmid'")
    return VmStatus(
        vmid=int(vmid),
        status=text_of(values, "status"),
        qmpstatus=None if qmp is None else str(qmp),
        name=None if name is None else str(name),
    )


def replication_job(item: object) -> ReplicationJob:
    """An entry of `GET /cluster/replication`: its `id` and integer `guest` (ReplicationConfig.pm
    parse_config)."""
    values = answer_dict(item)
    return ReplicationJob(id=text_of(values, "id"), guest=_vmid(values["guest"], "guest"))


def backup_job(item: object) -> BackupJob:
    """An entry of `GET /cluster/backup`: `vmid` and `exclude` are `pve-vmid-list`s (PVE::Tools split_list:
    split at NUL, white space, `,` and `;`), `all` and `enabled` booleans (`enabled` 1 when absent)."""
    values = answer_dict(item)
    pool, node = values.get("pool"), values.get("node")
    return BackupJob(
        id=text_of(values, "id"),
        vmids=_vmid_list(values.get("vmid"), "vmid"),
        all=answer_flag(values.get("all")) is True,
        exclude=_vmid_list(values.get("exclude"), "exclude"),
        pool=None if pool is None else str(pool),
        node=None if node is None else str(node),
        enabled=answer_flag(values.get("enabled")) is not False,
    )


def _vmid(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
        raise ShapeError(f"an integer {key!r}")
    return int(value)


def _vmid_list(value: object, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if not isinstance(value, str):
        raise ShapeError(f"a vmid list {key!r}")
    return tuple(_vmid(part, key) for part in re.split(r"[\0\s,;]+", value) if part)


def answer_flag(value: object) -> bool | None:
    return None if value is None else str(value) == "1"


def guest_config(data: object) -> GuestConfig:
    values = dict(answer_dict(data))
    digest = values.pop("digest", None)
    if not isinstance(digest, str):
        raise ShapeError("a config with a 'digest'")
    return GuestConfig(values=values, digest=digest)


def text_of(data: object, key: str) -> str:
    """`data[key]` of an object, which must be a string (KeyError when absent)."""
    value = answer_dict(data)[key]
    if not isinstance(value, str):
        raise ShapeError(f"a string {key!r}")
    return value


def answer_strings(data: object) -> list[str]:
    items = answer_list(data)
    if not all(isinstance(item, str) for item in items):
        raise ShapeError("a list of strings")
    return [str(item) for item in items]


def answer_dict(data: object) -> dict[str, object]:
    if not isinstance(data, dict):
        raise ShapeError("an object")
    return {str(key): value for key, value in data.items()}


def answer_list(data: object) -> list[object]:
    if not isinstance(data, list):
        raise ShapeError("a list")
    return list(data)
