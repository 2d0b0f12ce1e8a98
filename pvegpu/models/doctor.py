"""What the read-only reports (deploy/doctor.py) judge and print: a report's line with its level (`Finding`),
a read that failed (`NotRead`), and what the node doctor read of its VM's pre-start hook (`HookRead`, its
files on the node: `NodeFile`). Plain data; the judging is pvegpu/plan/doctor.py's, the reads
pvegpu/run/doctor_reads.py's, the logging pvegpu/run/reports.py's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One line of a report, without the host's prefix; `warning`: logged as a warning."""

    line: str
    warning: bool = False


@dataclass(frozen=True)
class NotRead:
    """A read that failed: `line` says why (the API error's one line, or why the `pve` data gives no
    client)."""

    line: str


@dataclass(frozen=True)
class NodeFile:
    """A file pvegpu writes on the node: its `path`, its sha256 there now (`found`; None: missing) and the
    sha256 of the bytes this pvegpu writes (`wanted`)."""

    path: str
    found: str | None
    wanted: str


@dataclass(frozen=True)
class HookRead:
    """What the hook's status is judged on: the VM's `hookscript` value (None: not set), and with
    `vm.self_heal` on the wrapper and zipapp on the node (`files`) and the bundle's pvegpu `version`."""

    hookscript: object
    files: tuple[NodeFile, ...] = ()
    version: str = ""
