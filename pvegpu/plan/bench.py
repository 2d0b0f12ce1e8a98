"""The serving benchmark's command lines and its reports (table, history line). Pure.

`bench_argv` builds `python -m sglang.benchmark.serving` (SGLang 0.5.23's entry point; `sglang.bench_serving`
is its deprecated alias) with the offline dataset `random-ids` (`random` downloads ShareGPT). `parse_results`
reads the tool's JSONL (one object per run, keys as in the knowledge file section 1.4); `results_table`
and `history_line` turn the rows into the files the operator keeps (the plot: `pvegpu.bench_plot`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pvegpu.models.bench import BenchSpec
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.errors import PlanError

_KEYS = ("max_concurrency", "completed", "output_throughput", "request_throughput", "median_ttft_ms",
         "p99_ttft_ms", "median_itl_ms")  # fmt: skip
_COUNTS = ("max_concurrency", "completed")  # integers; the rest are numbers (NaN too: JSON's NaN)


@dataclass(frozen=True)
class BenchRow:
    """One concurrency level's result."""

    concurrency: int
    completed: int
    output_throughput: float
    request_throughput: float
    median_ttft_ms: float
    p99_ttft_ms: float
    median_itl_ms: float


def bench_argv(
    bench: BenchSpec, sglang: SglangSpec, base_url: str, concurrency: int, output_file: str
) -> tuple[str, ...]:
    """The benchmark's argv for one concurrency level, appending its result to `output_file`."""
    return (
        f"{sglang.venv}/bin/python", "-m", "sglang.benchmark.serving",
        "--backend", "sglang-oai-chat", "--base-url", base_url,
        "--model", sglang.served_model_name, "--tokenizer", sglang.model_path,
        "--dataset-name", "random-ids", "--num-prompts", str(concurrency * bench.prompts_per_level),
        "--max-concurrency", str(concurrency),
        "--random-input-len", str(bench.input_len), "--random-output-len", str(bench.output_len),
        "--output-file", output_file,
    )  # fmt: skip


def parse_results(lines: Sequence[str]) -> tuple[BenchRow, ...]:
    """One row per JSON line, in order; PlanError naming the line for bad JSON or a missing key."""
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
        rows.append(BenchRow(int(values[0]), int(values[1]), *map(float, values[2:])))
    return tuple(rows)


def results_table(host: str, run_id: str, rows: Sequence[BenchRow]) -> str:
    """A markdown table of `rows`, titled with the host and run."""
    lines = [
        f"# SGLang serving benchmark: {host}, run {run_id}",
        "",
        "| concurrency | requests | output tok/s | requests/s | median TTFT ms | p99 TTFT ms "
        "| median ITL ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.concurrency} | {r.completed} | {r.output_throughput:.1f} | {r.request_throughput:.2f} | "
        f"{r.median_ttft_ms:.1f} | {r.p99_ttft_ms:.1f} | {r.median_itl_ms:.2f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def history_line(host: str, run_id: str, rows: Sequence[BenchRow]) -> str:
    """One JSON line for `history.jsonl`: run, host and every row, so runs can be compared later."""
    return json.dumps({"run": run_id, "host": host, "rows": [asdict(r) for r in rows]}, sort_keys=True) + "\n"
