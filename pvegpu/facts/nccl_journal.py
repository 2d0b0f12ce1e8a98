"""The NCCL transport lines of every run of the SGLang service still in its journal, grouped by run, so the
doctor can show them with and without NCCL's topology file (`NCCL_TOPO_FILE`). Pure.

Why the journal and not a record pvegpu keeps: every start of the service is one systemd invocation, and
journald tags each line with it (`_SYSTEMD_INVOCATION_ID`); NCCL says in that run's own lines whether it read
a topology file (`topology_file_lines`). So the journal already holds "with" and "without" side by side, as
NCCL logged them, with nothing to record when the environment changes and nothing re-run by the doctor. The
limit is the journal's retention: once the last run without the file has rotated out, the doctor says so.

Input (`SglangNcclRuns`, pvegpu/facts/sglang.py): a first line `current <invocation id>` (empty when the
service is not running), then `journalctl -o json` objects holding `_SYSTEMD_INVOCATION_ID`, `MESSAGE` and
`__REALTIME_TIMESTAMP` (microseconds since the epoch) for the NCCL lines only (a MESSAGE journald stored as
bytes, a list of numbers in JSON, never passes the command's grep).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.nccl import parse_transports, topology_file_lines, topology_file_read
from pvegpu.models.nccl import ChannelTransport, summarize


@dataclass(frozen=True)
class NcclRun:
    """One start of the service: its invocation id, when its first NCCL line was logged (µs since the epoch),
    NCCL's lines about its topology file and its channel records."""

    invocation: str
    started_us: int
    topology_file: tuple[str, ...]
    channels: tuple[ChannelTransport, ...]

    @property
    def with_topology_file(self) -> bool:
        """NCCL read its topology file in this run (`topology_file_read`)."""
        return topology_file_read(self.topology_file)


@dataclass(frozen=True)
class NcclRuns:
    """`current`: the running invocation's id (None: not running); `runs`: every run in journal order."""

    current: str | None
    runs: tuple[NcclRun, ...] = field(default=())

    def latest(self, *, with_topology_file: bool) -> NcclRun | None:
        """The latest run that logged channel lines, with (or without) the topology file; None if none."""
        found = [r for r in self.runs if r.channels and r.with_topology_file == with_topology_file]
        return found[-1] if found else None


def parse_nccl_runs(lines: Sequence[str]) -> NcclRuns:
    """The runs in `lines` (see the module docstring); FactParseError naming the line for any other shape.
    No lines at all (no journal, no `systemctl`): no current run, no runs."""
    if not lines:
        return NcclRuns(current=None)
    word, _, current = lines[0].strip().partition(" ")
    if word != "current":
        raise FactParseError(f"NCCL journal line 1: expected 'current <invocation id>', got {lines[0]!r}")
    messages: dict[str, list[str]] = {}
    started: dict[str, int] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            invocation, message = str(entry["_SYSTEMD_INVOCATION_ID"]), entry["MESSAGE"]
            if not isinstance(message, str):
                raise TypeError(f"MESSAGE is {message!r}")
            realtime = int(entry["__REALTIME_TIMESTAMP"])
        except (ValueError, KeyError, TypeError) as error:
            raise FactParseError(f"NCCL journal line {number}: not a journal entry ({error})") from None
        messages.setdefault(invocation, []).append(message)
        started.setdefault(invocation, realtime)
    runs = tuple(
        NcclRun(invocation, started[invocation], topology_file_lines(text), parse_transports(text))
        for invocation, text in messages.items()
    )
    return NcclRuns(current=current or None, runs=runs)


_NO_RUN = {
    True: "pvegpu writes the file on a VM guest whose node is in the run's inventory: run deploy/site.py",
    False: (
        "to get one: set sglang.env.NCCL_TOPO_FILE to an empty value, run deploy/site.py and "
        "deploy/doctor.py, then remove the override and run deploy/site.py again"
    ),
}


def topology_file_report(runs: NcclRuns) -> tuple[str, ...]:
    """Two blocks, with the topology file then without: which run (current or earlier, when NCCL first logged
    in it), what NCCL said of the file, and the transports per rank pair; a block without a run says how to
    get one."""
    blocks = []
    for with_file in (True, False):
        title = f"NCCL {'with' if with_file else 'without'} the topology file"
        run = runs.latest(with_topology_file=with_file)
        if run is None:
            blocks.append(
                f"{title}: no run in the journal that logged NCCL's channels ({_NO_RUN[with_file]})"
            )
            continue
        when = datetime.fromtimestamp(run.started_us / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        which = "the current run" if run.invocation == runs.current else "an earlier run"
        said = "; ".join(run.topology_file) or "NCCL_TOPO_FILE not set"
        pairs = "".join(f"\n  {pair.describe()}" for pair in summarize(run.channels))
        blocks.append(f"{title} ({which}, logged from {when}): {said}{pairs}")
    return tuple(blocks)
