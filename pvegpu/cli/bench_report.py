"""The benchmark's reports on the operator's machine: a table, a PNG plot (throughput and latency against
concurrency, matplotlib's Agg backend) and a history line per run; per host, the comparison of the latest
run of each VM speed setting (`compare.md`, `compare.png`), rewritten after every run; and the run against
the reference box's published figures (`vs-reference.md`, `vs-reference.png`).

Kept apart from `pvegpu.plan.bench` so that only the bench deploy pays matplotlib's import.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from pvegpu.models.bench import BenchSpec
from pvegpu.models.bench_reference import load_reference
from pvegpu.plan.bench import (
    BASELINE,
    BenchRow,
    HistoryRun,
    SpeedSettings,
    bench_cells,
    change,
    compared_runs,
    comparison_table,
    history_line,
    levels_of,
    parse_history,
    parse_results,
    results_table,
    throughput,
)
from pvegpu.plan.bench_reference import VsCell, node_mtp, vs_reference, vs_reference_table
from pvegpu.plan.errors import PlanError

WIDTH_IN, HEIGHT_IN, DPI = 10.0, 4.0, 100


def _png(figure: Figure, title: str) -> bytes:
    """`figure` under `title` as PNG bytes, without a timestamp in the metadata (deterministic)."""
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


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
    return _png(figure, title)


def comparison_png(host: str, runs: Sequence[HistoryRun]) -> bytes:
    """One panel per concurrency level: a bar of output tokens/s per setting (from `compared_runs`), labelled
    with its change against the baseline (grey bar). Deterministic; PlanError without runs."""
    if not runs:
        raise PlanError("no labelled benchmark runs to compare")
    base = next((run for run in runs if run.settings == BASELINE), None)
    levels = levels_of(runs)
    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    names = [_short(run.settings) for run in runs]
    for axes, level in zip(figure.subplots(1, len(levels), squeeze=False)[0], levels, strict=True):
        values = [throughput(run, level) or 0.0 for run in runs]
        colors = ["C7" if run is base else "C0" for run in runs]
        bars = axes.bar(range(len(runs)), values, color=colors)
        if base is not None:
            baseline = throughput(base, level)
            axes.bar_label(
                bars,
                labels=[
                    "baseline" if run is base else change(throughput(run, level), baseline) for run in runs
                ],
            )
        axes.set_xticks(range(len(runs)), names, fontsize="small")
        axes.set(title=f"concurrency {level}", ylabel="output tokens/s")
        axes.margins(y=0.12)  # room for the labels above the bars
        axes.grid(True, axis="y", alpha=0.3)
    return _png(figure, f"What each VM speed setting bought: {host}")


def _short(settings: SpeedSettings | None) -> str:
    assert settings is not None  # compared_runs keeps labelled runs only
    return f"numa {settings.numa}\ntopo {settings.topo_file}\np2p {settings.p2p}"


def vs_reference_png(host: str, vs: Sequence[VsCell]) -> bytes:
    """The node against the reference: tok/s per concurrency at context 0 (log2 axis), and per long prompt
    of one request (bars; the reference's range as an error bar). Deterministic; PlanError without cells."""
    if not vs:
        raise PlanError("no benchmark cells to compare with the reference")
    levels = [cell for cell in vs if not cell.cell.context]
    contexts = [cell for cell in vs if cell.cell.context]
    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    panels = figure.subplots(1, int(bool(levels)) + int(bool(contexts)), squeeze=False)[0]
    if levels:
        axes = panels[0]
        concurrency = [cell.cell.concurrency for cell in levels]
        for label, values, marker, color in (
            ("this node", [cell.node for cell in levels], "o", "C0"),
            ("reference", [None if c.reference is None else sum(c.reference) / 2 for c in levels], "s", "C7"),
        ):
            axes.plot(concurrency, [float("nan") if v is None else v for v in values], marker=marker,
                      color=color, label=label)  # fmt: skip
        axes.set(title="Context 0", xlabel="concurrency", ylabel="output tokens/s")
        axes.set_xscale("log", base=2)
        axes.set_xticks(concurrency, [str(c) for c in concurrency])
        axes.legend()
        axes.grid(True, alpha=0.3)
    if contexts:
        axes = panels[-1]
        where = range(len(contexts))
        axes.bar([x - 0.2 for x in where], [cell.node or 0.0 for cell in contexts], 0.4, color="C0",
                 label="this node")  # fmt: skip
        middles = [0.0 if c.reference is None else sum(c.reference) / 2 for c in contexts]
        spans = [0.0 if c.reference is None else (c.reference[1] - c.reference[0]) / 2 for c in contexts]
        axes.bar([x + 0.2 for x in where], middles, 0.4, yerr=spans, color="C7", label="reference")
        axes.set_xticks(list(where), [f"{cell.cell.context // 1024}k" for cell in contexts])
        axes.set(title="One request, long prompt", xlabel="prompt tokens", ylabel="output tokens/s")
        axes.legend()
        axes.grid(True, axis="y", alpha=0.3)
    return _png(figure, f"{host} against the reference box")


def write_reports(
    local: Path, host_name: str, run_id: str, *, history: Path, settings: SpeedSettings, bench: BenchSpec
) -> None:
    """Write `<run>.md` (table) and `<run>.png` (plot) beside the JSONL `local`; add a line to `history`;
    rewrite `compare.md` and `compare.png` beside `local` from the whole history of `host_name`, and
    `vs-reference.md` and `vs-reference.png` from this run."""
    rows = parse_results(local.read_text().splitlines(), bench.input_len)
    reference = load_reference()
    vs = vs_reference(bench_cells(bench), rows, reference)
    local.with_name("vs-reference.md").write_text(
        vs_reference_table(
            host_name, run_id, vs, reference=reference, accept_length=node_mtp(rows), settings=settings,
            max_minutes=bench.max_minutes,
        )
    )  # fmt: skip
    local.with_name("vs-reference.png").write_bytes(vs_reference_png(host_name, vs))
    if not rows:
        raise PlanError(f"{host_name}: no benchmark cell ran within bench.max_minutes ({bench.max_minutes})")
    local.with_suffix(".md").write_text(results_table(host_name, run_id, rows, settings))
    local.with_suffix(".png").write_bytes(plot_png(rows))
    with history.open("a") as out:
        out.write(history_line(host_name, run_id, rows, settings))
    runs = compared_runs(host_name, parse_history(history.read_text().splitlines()))
    local.with_name("compare.md").write_text(comparison_table(host_name, runs))
    local.with_name("compare.png").write_bytes(comparison_png(host_name, runs))
