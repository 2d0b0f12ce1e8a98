"""A run against the reference box: every cell of the matrix beside the reference's published figure for the
node's MTP state, with the ratio; cells not run within bench.max_minutes said so; the PNG a real plot."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from pvegpu.cli.bench_report import DPI, HEIGHT_IN, WIDTH_IN, vs_reference_png, write_reports
from pvegpu.models.bench import BenchSpec
from pvegpu.models.bench_reference import load_reference
from pvegpu.plan.bench import BASELINE, BenchCell, BenchRow, bench_cells
from pvegpu.plan.bench_reference import VsCell, node_mtp, vs_reference, vs_reference_table
from pvegpu.plan.errors import PlanError

REFERENCE = load_reference()


def row(concurrency: int, tok_s: float, context: int = 0, accept: float | None = None) -> BenchRow:
    return BenchRow(concurrency, concurrency * 4, tok_s, 1.0, 100.0, 200.0, 10.0, context, accept)


def test_reference_figures_as_published() -> None:
    assert REFERENCE.figure(False, 64, 0) == (1010.6, 1010.6)
    assert REFERENCE.figure(True, 1, 0) == (93.7, 93.7)
    assert REFERENCE.figure(True, 1, 32768) == (70.0, 73.0)
    assert REFERENCE.figure(False, 1, 32768) is None  # published with MTP only
    assert REFERENCE.figure(True, 2, 32768) is None
    assert REFERENCE.figure(True, 3, 0) is None


def test_table_with_mtp_every_cell_and_the_ratio() -> None:
    cells = bench_cells(BenchSpec(concurrency=(1, 64), contexts=(16384, 32768, 65536)))
    rows = (row(1, 84.3, accept=2.41), row(64, 1282.1, accept=2.2), row(1, 75.0, 16384, 2.3),
            row(1, 61.0, 32768, 2.3))  # fmt: skip
    vs = vs_reference(cells, rows, REFERENCE)
    assert node_mtp(rows) == 2.41
    text = vs_reference_table("gpu-vm", "r9", vs, reference=REFERENCE, accept_length=2.41, settings=BASELINE,
                              max_minutes=60)  # fmt: skip
    assert text.splitlines() == [
        "# gpu-vm against the reference box: run r9",
        "",
        "Reference: GLM-5 NVFP4 on the reference box, 8x RTX PRO 6000 Blackwell, 2-socket AMD EPYC, bare "
        "metal, SGLang, TP8, NVFP4, MoE runner cutlass, MTP on (voipmonitor/rtx6kpro models/glm5.md "
        "(March 2026): decode tok/s; published figures, not measured by pvegpu).",
        "This node: MTP on (accept length 2.41); settings in force: numa flat, topo file off, p2p off. Its "
        "figures are measured by this run; the reference's are published ones.",
        "",
        "| context | concurrency | this node tok/s | reference tok/s | ratio |",
        "|---:|---:|---:|---:|---:|",
        "| 0 | 1 | 84.3 | 93.7 | 0.90 |",
        "| 0 | 64 | 1282.1 | 1424.6 | 0.90 |",
        "| 16384 | 1 | 75.0 | 83.0 | 0.90 |",
        "| 32768 | 1 | 61.0 | 70.0-73.0 | 0.84-0.87 |",
        "| 65536 | 1 | not run (bench.max_minutes 60) | 66.0-73.0 | - |",
    ]


def test_without_mtp_the_mtp_off_row_and_no_long_context_figure() -> None:
    cells = bench_cells(BenchSpec(concurrency=(8,), contexts=(16384,)))
    vs = vs_reference(cells, (row(8, 138.45), row(1, 40.0, 16384)), REFERENCE)
    assert vs == (
        VsCell(BenchCell(8, 128, 0), 138.45, (276.9, 276.9)),
        VsCell(BenchCell(1, 16384, 16384), 40.0, None),
    )
    assert [cell.ratio() for cell in vs] == ["0.50", "-"]


def test_png_is_a_real_plot_of_both_panels(tmp_path: Path) -> None:
    cells = bench_cells(BenchSpec(concurrency=(1, 2, 4), contexts=(16384, 32768)))
    rows = (row(1, 50.0), row(2, 90.0), row(4, 150.0), row(1, 40.0, 16384))
    png = vs_reference_png("gpu-vm", vs_reference(cells, rows, REFERENCE))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(io.BytesIO(png))
    assert pixels.shape[:2] == (int(HEIGHT_IN * DPI), int(WIDTH_IN * DPI))
    colors = {tuple(round(channel * 255) for channel in pixel[:3]) for line in pixels for pixel in line}
    assert {(31, 119, 180), (127, 127, 127)} <= colors  # the node (C0) and the reference (C7)
    assert vs_reference_png("gpu-vm", vs_reference(cells, rows, REFERENCE)) == png

    local = tmp_path / "gpu-vm" / "r1.jsonl"
    local.parent.mkdir()
    local.write_text("".join(json.dumps(_result(r)) + "\n" for r in rows))
    write_reports(local, "gpu-vm", "r1", history=tmp_path / "history.jsonl", settings=BASELINE,
                  bench=BenchSpec(concurrency=(1, 2, 4), contexts=(16384, 32768)))  # fmt: skip
    assert (local.parent / "vs-reference.png").read_bytes() == png
    table = (local.parent / "vs-reference.md").read_text().splitlines()
    assert table[-1] == "| 32768 | 1 | not run (bench.max_minutes 60) | - | - |"


def test_no_cell_within_the_budget_reports_every_cell_not_run(tmp_path: Path) -> None:
    local = tmp_path / "gpu-vm" / "r2.jsonl"
    local.parent.mkdir()
    local.write_text("")  # the clock's empty results file: every cell printed the skip line
    with pytest.raises(PlanError, match=r"^gpu-vm: no benchmark cell ran within bench.max_minutes \(5\)$"):
        write_reports(local, "gpu-vm", "r2", history=tmp_path / "history.jsonl", settings=BASELINE,
                      bench=BenchSpec(concurrency=(1,), contexts=(), max_minutes=5))  # fmt: skip
    assert (local.parent / "vs-reference.md").read_text().splitlines()[-1] == (
        "| 0 | 1 | not run (bench.max_minutes 5) | 50.4 | - |"
    )
    assert not (tmp_path / "history.jsonl").exists()


def _result(r: BenchRow) -> dict[str, object]:
    """`r` as sglang.benchmark.serving writes it (its keys), with the prompt length the cell asked for."""
    return {
        "max_concurrency": r.concurrency, "completed": r.completed, "output_throughput": r.output_throughput,
        "request_throughput": r.request_throughput, "median_ttft_ms": r.median_ttft_ms,
        "p99_ttft_ms": r.p99_ttft_ms, "median_itl_ms": r.median_itl_ms,
        "random_input_len": r.context or 128, "accept_length": r.accept_length,
    }  # fmt: skip
