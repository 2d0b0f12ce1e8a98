"""The serving benchmark's command lines and its reports (table, history line, comparison). Pure.

`bench_argv` builds `python -m sglang.benchmark.serving` (SGLang 0.5.23's entry point; `sglang.bench_serving`
is its deprecated alias) with the offline dataset `random-ids` (`random` downloads ShareGPT). `parse_results`
reads the tool's JSONL (one object per run, keys as in the knowledge file section 1.4); `results_table`
and `history_line` turn the rows into the files the operator keeps (the plots: `pvegpu.cli.bench_report`).

Each run is labelled with the VM speed settings in force when it ran (`SpeedSettings`, read from the serving
host by roles/bench.py, never typed by the operator): the guest's NUMA nodes (`vm.numa_layout`), whether NCCL
read a topology file (`NCCL_TOPO_FILE`) and whether it moves data GPU to GPU (`vm.p2p`), the last two from
the running service's NCCL log. `parse_history` reads `history.jsonl` back; `compared_runs` keeps the latest
run of each distinct setting of one host and `comparison_table` shows what each bought against the baseline
(flat, no topology file, no P2P).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, TypeVar

from pvegpu.models.bench import BenchSpec
from pvegpu.models.p2p import Record
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.sglang_service import probe_host

_KEYS = ("max_concurrency", "completed", "output_throughput", "request_throughput", "median_ttft_ms",
         "p99_ttft_ms", "median_itl_ms")  # fmt: skip
_COUNTS = ("max_concurrency", "completed")  # integers; the rest are numbers (NaN too: JSON's NaN)


@dataclass(frozen=True)
class BenchRow:
    """One cell's result: a concurrency level (`context` 0: the short prompts), or a single request with
    `context` prompt tokens; `accept_length`: MTP's average accepted tokens per step as SGLang reported it
    (None: no speculative decoding, or a run saved before it was recorded)."""

    concurrency: int
    completed: int
    output_throughput: float
    request_throughput: float
    median_ttft_ms: float
    p99_ttft_ms: float
    median_itl_ms: float
    context: int = 0
    accept_length: float | None = None


@dataclass(frozen=True)
class BenchCell:
    """One run of the benchmark: `concurrency` requests at a time with `input_len` prompt tokens; `context`
    0 for the concurrency levels, else the long prompt's length."""

    concurrency: int
    input_len: int
    context: int

    def describe(self) -> str:
        if self.context:
            return f"1 request with {self.context} prompt tokens"
        return f"concurrency {self.concurrency}"


def bench_cells(bench: BenchSpec) -> tuple[BenchCell, ...]:
    """The run's cells in order: each concurrency level, then one request per context."""
    return (
        *(BenchCell(level, bench.input_len, 0) for level in bench.concurrency),
        *(BenchCell(1, context, context) for context in bench.contexts),
    )


Numa = Literal["host", "flat"]
TopoFile = Literal["on", "off", "unknown"]
P2p = Literal["off", "probe-passed", "on", "unknown"]
# Each setting's values, off first: the comparison's row order (SpeedSettings.order).
_NUMA: tuple[Numa, ...] = ("flat", "host")
_TOPO_FILE: tuple[TopoFile, ...] = ("off", "on", "unknown")
_P2P: tuple[P2p, ...] = ("off", "probe-passed", "on", "unknown")
_Label = TypeVar("_Label", bound=str)


@dataclass(frozen=True)
class SpeedSettings:
    """The VM speed settings in force during a run: `numa` host (the serving host sees several NUMA nodes:
    `vm.numa_layout: host`, or bare metal's own) or flat; `topo_file` on when NCCL read its topology file
    (`NCCL_TOPO_FILE`); `p2p` on when NCCL moves data GPU to GPU, probe-passed when the guest's P2P probe
    passed too (`vm.p2p: probe`). `unknown` where the running service logged no NCCL channel lines
    (NCCL_DEBUG not INFO, one GPU, or the service not running)."""

    numa: Numa
    topo_file: TopoFile
    p2p: P2p

    def describe(self) -> str:
        """`numa flat, topo file off, p2p off`."""
        return f"numa {self.numa}, topo file {self.topo_file}, p2p {self.p2p}"

    def order(self) -> tuple[int, int, int, int]:
        """Sort key: fewer settings on first, then by step (numa, topology file, P2P)."""
        ranks = (_NUMA.index(self.numa), _TOPO_FILE.index(self.topo_file), _P2P.index(self.p2p))
        return (sum(rank > 0 for rank in ranks), *ranks)


BASELINE = SpeedSettings(numa="flat", topo_file="off", p2p="off")


def speed_settings(
    *, numa_nodes: int, nccl_logged: bool, topo_file_read: bool, p2p_in_use: bool, p2p_record: Record | None
) -> SpeedSettings:
    """The label of a run from what the serving host shows: its NUMA node count; whether the running
    service's NCCL log has channel lines at all (`nccl_logged`), said it read its topology file, chose P2P
    between some ranks; the guest's P2P probe record (`pvegpu.models.p2p.RECORD_PATH`, None: none or not
    read), whose passed probe tells `probe-passed` from `on` (vm.p2p: on, or bare metal's own P2P)."""
    numa: Numa = "host" if numa_nodes > 1 else "flat"
    if not nccl_logged:
        return SpeedSettings(numa=numa, topo_file="unknown", p2p="unknown")
    passed = p2p_record is not None and p2p_record.mode == "probe" and p2p_record.verdict == "p2p"
    p2p: P2p = ("probe-passed" if passed else "on") if p2p_in_use else "off"
    return SpeedSettings(numa=numa, topo_file="on" if topo_file_read else "off", p2p=p2p)


@dataclass(frozen=True)
class BenchPlan:
    """A benchmark run's cells in order (`bench_cells`), each with its argv (`bench_argv`) against the
    serving host's SGLang (`probe_host(sglang.host)` and `sglang.port`)."""

    runs: tuple[tuple[BenchCell, tuple[str, ...]], ...]


def plan_bench(bench: BenchSpec, sglang: SglangSpec, output_file: str) -> BenchPlan:
    """The run of `bench` against `sglang`, each cell appending its result to `output_file`."""
    base_url = f"http://{probe_host(sglang.host)}:{sglang.port}"
    return BenchPlan(
        tuple((cell, bench_argv(bench, sglang, base_url, cell, output_file)) for cell in bench_cells(bench))
    )


def bench_argv(
    bench: BenchSpec, sglang: SglangSpec, base_url: str, cell: BenchCell, output_file: str
) -> tuple[str, ...]:
    """The benchmark's argv for one cell, appending its result to `output_file`."""
    concurrency = cell.concurrency
    return (
        f"{sglang.venv}/bin/python", "-m", "sglang.benchmark.serving",
        "--backend", "sglang-oai-chat", "--base-url", base_url,
        "--model", sglang.served_model_name, "--tokenizer", sglang.model_path,
        "--dataset-name", "random-ids", "--num-prompts", str(concurrency * bench.prompts_per_level),
        "--max-concurrency", str(concurrency),
        "--random-input-len", str(cell.input_len), "--random-output-len", str(bench.output_len),
        "--output-file", output_file,
    )  # fmt: skip


def parse_results(lines: Sequence[str], input_len: int) -> tuple[BenchRow, ...]:
    """One row per JSON line, in order; a line whose `random_input_len` is not `input_len` (the levels'
    prompts) is a long-context cell. PlanError naming the line for bad JSON or a missing key."""
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            values = [record[key] for key in _KEYS]
        except (ValueError, KeyError, TypeError) as error:  # ValueError: bad JSON, or a 4300+ digit number
            raise PlanError(f"benchmark result line {number}: not a result object ({error})") from None
        for key, value in zip(_KEYS, values, strict=True):
            counted = key in _COUNTS
            if isinstance(value, bool) or not isinstance(value, int if counted else int | float):
                kind = "an integer" if counted else "a number"
                raise PlanError(f"benchmark result line {number}: {key} is {value!r}, not {kind}")
        prompt, accepted = record.get("random_input_len", input_len), record.get("accept_length")
        if isinstance(prompt, bool) or not isinstance(prompt, int):
            raise PlanError(f"benchmark result line {number}: random_input_len is {prompt!r}, not an integer")
        if accepted is not None and (isinstance(accepted, bool) or not isinstance(accepted, int | float)):
            raise PlanError(f"benchmark result line {number}: accept_length is {accepted!r}, not a number")
        context = 0 if prompt == input_len else prompt
        accept = float(accepted) if accepted else None  # 0 or None: no speculative decoding
        floats = dict(zip(_KEYS[2:], map(float, values[2:]), strict=True))
        rows.append(
            BenchRow(
                concurrency=int(values[0]),
                completed=int(values[1]),
                output_throughput=floats["output_throughput"],
                request_throughput=floats["request_throughput"],
                median_ttft_ms=floats["median_ttft_ms"],
                p99_ttft_ms=floats["p99_ttft_ms"],
                median_itl_ms=floats["median_itl_ms"],
                context=context,
                accept_length=accept,
            )
        )
    return tuple(rows)


def results_table(host: str, run_id: str, rows: Sequence[BenchRow], settings: SpeedSettings) -> str:
    """A markdown table of `rows`, titled with the host and run, under the settings in force."""
    lines = [
        f"# SGLang serving benchmark: {host}, run {run_id}",
        "",
        f"Settings in force: {settings.describe()}.",
        "",
        "| context | concurrency | requests | output tok/s | requests/s | median TTFT ms | p99 TTFT ms "
        "| median ITL ms | accept length |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.context} | {r.concurrency} | {r.completed} | {r.output_throughput:.1f} | "
        f"{r.request_throughput:.2f} | {r.median_ttft_ms:.1f} | {r.p99_ttft_ms:.1f} | "
        f"{r.median_itl_ms:.2f} | {'-' if r.accept_length is None else f'{r.accept_length:.2f}'} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def history_line(host: str, run_id: str, rows: Sequence[BenchRow], settings: SpeedSettings) -> str:
    """One JSON line for `history.jsonl`: run, host, settings and every row, so runs can be compared later."""
    record = {"run": run_id, "host": host, "settings": asdict(settings), "rows": [asdict(r) for r in rows]}
    return json.dumps(record, sort_keys=True) + "\n"


@dataclass(frozen=True)
class HistoryRun:
    """One line of `history.jsonl`; `settings` None for a run saved before runs were labelled."""

    run: str
    host: str
    settings: SpeedSettings | None
    rows: tuple[BenchRow, ...]


def parse_history(lines: Sequence[str]) -> tuple[HistoryRun, ...]:
    """Every run in `history.jsonl`, in order; PlanError naming the line for one pvegpu did not write."""
    runs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            labels = record.get("settings")
            settings = None if labels is None else _settings(labels)
            rows = tuple(BenchRow(**row) for row in record["rows"])
            runs.append(HistoryRun(str(record["run"]), str(record["host"]), settings, rows))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise PlanError(f"benchmark history line {number}: not a run pvegpu saved ({error})") from None
    return tuple(runs)


def _settings(labels: Mapping[str, str]) -> SpeedSettings:
    return SpeedSettings(
        numa=_one_of(_NUMA, labels["numa"]),
        topo_file=_one_of(_TOPO_FILE, labels["topo_file"]),
        p2p=_one_of(_P2P, labels["p2p"]),
    )


def _one_of(allowed: tuple[_Label, ...], value: str) -> _Label:
    if value not in allowed:
        raise ValueError(f"setting {value!r} is none of {', '.join(allowed)}")
    return allowed[allowed.index(value)]


def compared_runs(host: str, runs: Sequence[HistoryRun]) -> tuple[HistoryRun, ...]:
    """The latest labelled run of each distinct setting on `host`, baseline first, then by step."""
    latest: dict[SpeedSettings, HistoryRun] = {}
    for run in runs:
        if run.host == host and run.settings is not None:
            latest[run.settings] = run
    return tuple(latest[settings] for settings in sorted(latest, key=SpeedSettings.order))


def throughput(run: HistoryRun, concurrency: int) -> float | None:
    """The run's output tokens/s at `concurrency` (context 0); None when it did not measure that level."""
    return next(
        (row.output_throughput for row in run.rows if row.concurrency == concurrency and not row.context),
        None,
    )


def change(value: float | None, base: float | None) -> str:
    """`+10.0%` against the baseline's value; `-` where either is missing (or the baseline is 0)."""
    if value is None or not base:
        return "-"
    return f"{(value - base) / base * 100:+.1f}%"


def levels_of(runs: Sequence[HistoryRun]) -> tuple[int, ...]:
    """Every concurrency level (context 0) the runs measured, ascending."""
    return tuple(sorted({row.concurrency for run in runs for row in run.rows if not row.context}))


def comparison_table(host: str, runs: Sequence[HistoryRun]) -> str:
    """A markdown table of `runs` (from `compared_runs`): output tokens/s per concurrency level and the change
    against the baseline run; without a baseline run a line says so and the changes are `-`."""
    base = next((run for run in runs if run.settings == BASELINE), None)
    levels = levels_of(runs)
    note = (
        f"The latest run of each setting; change against the baseline ({BASELINE.describe()})."
        if base
        else f"No baseline run ({BASELINE.describe()}) yet: the changes against it are `-`."
    )
    lines = [
        f"# What each VM speed setting bought: {host}",
        "",
        note,
        "",
        "| numa | topo file | p2p | run |" + "".join(f" tok/s at {level} | change |" for level in levels),
        "|---|---|---|---|" + "---:|---:|" * len(levels),
    ]
    for run in runs:
        assert run.settings is not None  # compared_runs keeps labelled runs only
        cells = [run.settings.numa, run.settings.topo_file, run.settings.p2p, run.run]
        for level in levels:
            value = throughput(run, level)
            cells.append("-" if value is None else f"{value:.1f}")
            if base is None or run is base:
                cells.append("-" if base is None else "baseline")
            else:
                cells.append(change(value, throughput(base, level)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
