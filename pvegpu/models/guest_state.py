"""A serving host's files, systemd units and users as its state read shows them
(`pvegpu.facts.host_read`). Plain frozen data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PathKind = Literal["file", "directory", "link", "other", "missing"]


@dataclass(frozen=True)
class PathState:
    """One path: its kind (a link is not followed), mode (octal digits, e.g. `644`), owner, and the sha256 of
    a regular file's content."""

    kind: PathKind
    mode: str = ""
    user: str = ""
    group: str = ""
    sha256: str | None = None


MISSING = PathState("missing")


@dataclass(frozen=True)
class UnitState:
    """A systemd unit as pyinfra's SystemdStatus / SystemdEnabled facts read it; `needs_reload`: its file on
    disk is newer than what systemd loaded (`NeedDaemonReload=yes`: written, and units not reloaded since)."""

    running: bool
    enabled: bool
    needs_reload: bool = False


@dataclass(frozen=True)
class UserEntry:
    """A passwd entry and its primary group's name."""

    name: str
    home: str
    shell: str
    group: str
