"""The benchmark's reports on the operator's machine: a table, a PNG plot (throughput and latency against
concurrency, matplotlib's Agg backend) and a history line per run.

Kept apart from `pvegpu.plan.bench` so that only the bench deploy pays matplotlib's import.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from pvegpu.plan.bench import BenchRow, history_line, parse_results, results_table
from pvegpu.plan.errors import PlanError

WIDTH_IN, HEIGHT_IN, DPI = 10.0, 4.0, 100


def plot_png(rows: Sequence[BenchRow], title: str = "SGLang serving benchmark") -> bytes:
    """Two panels against concurrency (log2 axis): output tokens/s; median TTFT and median ITL in ms.

    Deterministic for the same rows (no timestamp in the PNG metadata). PlanError without rows.
    """
    if not rows:
        raise PlanError("no benchmark results to plot")
    concurrency = [row.concurrency for row in rows]
    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    throughput, latency = figure.subplots(1, 2)
    throughput.plot(concurrency, [row.output_throughput for row in rows], marker="o", color="C0")
    throughput.set(title="Throughput", xlabel="concurrency", ylabel="output tokens/s")
    latency.plot(
        concurrency, [row.median_ttft_ms for row in rows], marker="o", color="C3", label="median TTFT"
    )
    latency.plot(concurrency, [row.median_itl_ms for row in rows], marker="s", color="C1", label="median ITL")
    latency.set(title="Latency", xlabel="concurrency", ylabel="ms", yscale="log")
    latency.legend()
    for axes in (throughput, latency):
        axes.set_xscale("log", base=2)
        axes.set_xticks(concurrency, [str(c) for c in concurrency])
        axes.grid(True, alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def write_reports(local: Path, host_name: str, run_id: str, history: Path) -> None:
    """Write `<run>.md` (table) and `<run>.png` (plot) beside the JSONL `local`; add a line to `history`."""
    rows = parse_results(local.read_text().splitlines())
    local.with_suffix(".md").write_text(results_table(host_name, run_id, rows))
    local.with_suffix(".png").write_bytes(plot_png(rows))
    with history.open("a") as out:
        out.write(history_line(host_name, run_id, rows))
