"""The fetcher's record and status files (pvegpu/fetch/main.py writes them), and the model directory's
file list as the host's one state read prints it (`store_command`); pure parsers. `ModelStoreRead` reads
the record and the list in one command, for the doctor. While a run waits for the fetch unit:
`fetch_look_command` (its status file and the unit's state, one command; `parse_fetch_look`),
`fetch_start_command`, `fetch_journal_command`."""

from __future__ import annotations

import binascii
import json
import shlex
from base64 import b64decode
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.models.model_store import (
    FETCH_UNIT,
    FetchStatus,
    ModelRecord,
    StoreFile,
    record_path,
    status_path,
)


def store_command(directory: str) -> str:
    """Every regular file under `directory` but the fetcher's own `.pvegpu/`: `<size> <mtime> <path>` (GNU
    find's `%T@`: seconds, then ten digits of which nine are the nanoseconds), or `missing`."""
    quoted = shlex.quote(directory)
    return (
        f"if [ -d {quoted} ]; then find {quoted} -path {shlex.quote(directory + '/.pvegpu')} -prune -o "
        "-type f -printf '%s %T@ %P\\n'; else echo missing; fi"
    )


def parse_store(lines: Sequence[str]) -> Mapping[str, StoreFile] | None:
    """`store_command`'s lines -> each file by its path under the directory; None: no directory."""
    if [line.strip() for line in lines] == ["missing"]:
        return None
    files = {}
    for line in lines:
        if not line:
            continue
        size, mtime, path = [*line.split(" ", 2), "", ""][:3]
        seconds, _, fraction = mtime.partition(".")
        if not (size.isdigit() and seconds.isdigit() and fraction.isdigit() and path):
            raise FactParseError(f"model store: {line!r} is not '<size> <seconds.fraction> <path>'")
        files[path] = StoreFile(int(size), int(seconds) * 10**9 + int(fraction[:9].ljust(9, "0")))
    return files


def parse_model_record(text: str | None) -> ModelRecord | None:
    """The record's JSON -> ModelRecord; None when absent or not a record (the fetcher writes it again)."""
    value = _json(text)
    try:
        files = {
            path: StoreFile(int(entry["size"]), int(entry["mtime_ns"]))
            for path, entry in value["files"].items()
        }
        return ModelRecord(
            repo=str(value["repo"]),
            revision=value["revision"],
            commit=value["commit"],
            complete=value["complete"] is True,
            files=files,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def parse_fetch_status(text: str | None) -> FetchStatus | None:
    """`status.json` -> FetchStatus; None when absent or half-written."""
    value = _json(text)
    try:
        return FetchStatus(
            state=str(value["state"]),
            done=int(value.get("done", 0)),
            total=int(value.get("total", 0)),
            message=value.get("message"),
            time=float(value["time"]),
            phase=value.get("phase"),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class FetchLook:
    """One look at the fetch: its status file (None: absent or half-written) and the unit's `ActiveState`
    and `Result` (systemd's words; empty when systemctl printed none)."""

    status: FetchStatus | None
    active: str
    result: str


def fetch_look_command(model_path: str) -> str:
    """The status file on one line (an empty line: none), then `systemctl show` of the unit's ActiveState and
    Result (`KEY=value` lines, in systemd's order)."""
    status = shlex.quote(status_path(model_path))
    return (
        f"cat {status} 2>/dev/null | tr -d '\\n'; echo; "
        f"systemctl show --property ActiveState --property Result {FETCH_UNIT}"
    )


def parse_fetch_look(lines: Sequence[str]) -> FetchLook:
    """`fetch_look_command`'s lines -> FetchLook. Pure; FactParseError for a unit line not KEY=value."""
    status = parse_fetch_status(lines[0] if lines and lines[0] else None)
    unit = {}
    for line in lines[1:]:
        key, equals, value = line.partition("=")
        if not equals:
            raise FactParseError(f"model fetch: {line!r} is not a systemctl show KEY=value line")
        unit[key] = value
    return FetchLook(status, unit.get("ActiveState", ""), unit.get("Result", ""))


def fetch_start_command(model_path: str) -> str:
    """The unit started without waiting for it, its last status and failed state cleared first."""
    return (
        f"rm -f {shlex.quote(status_path(model_path))}; systemctl reset-failed {FETCH_UNIT} 2>/dev/null; "
        f"systemctl start --no-block {FETCH_UNIT}"
    )


def fetch_journal_command(lines: int) -> str:
    """The unit's last `lines` journal lines, their messages only."""
    return f"journalctl --unit {FETCH_UNIT} --lines {lines} --output cat --no-pager"


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


StoreRead = tuple[ModelRecord | None, Mapping[str, StoreFile] | None]


def store_read_command(model_path: str) -> str:
    """The record's base64 (an empty line without one), then `store_command`'s lines."""
    record = shlex.quote(record_path(model_path))
    return f"if [ -f {record} ]; then base64 -w0 < {record}; fi; echo; {store_command(model_path)}"


def parse_store_read(output: Sequence[str]) -> StoreRead:
    """`store_read_command`'s lines -> (the record, the directory's files); FactParseError for a record that
    is not base64."""
    encoded, files = (output[0] if output else ""), output[1:]
    try:
        text = b64decode(encoded, validate=True).decode() if encoded else None
    except (binascii.Error, UnicodeDecodeError):
        raise FactParseError(f"model store: the record is not base64: {encoded[:40]!r}") from None
    return parse_model_record(text), parse_store(files)


class ModelStoreRead(FactBase[StoreRead]):
    """The fetcher's record and the model directory's file list in one command, for the doctor (a run
    reads both in the host's one state read; a node's model store, in the node's read):
    `host.get_fact(ModelStoreRead, model_path=...)`."""

    @override
    def command(self, model_path: str) -> str:
        return store_read_command(model_path)

    @override
    def process(self, output: list[str]) -> StoreRead:
        return parse_store_read(output)
