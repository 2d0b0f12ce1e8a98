"""The serving benchmark's pure parts: argv, result parsing, table, history line, PNG plot, BenchSpec."""

from __future__ import annotations

import io
import json

import pytest
from matplotlib.image import imread

from pvegpu.bench_report import DPI, HEIGHT_IN, WIDTH_IN, plot_png
from pvegpu.models.bench import BenchSpec
from pvegpu.models.errors import InventoryError
from pvegpu.models.inventory import validate_inventory
from pvegpu.models.sglang import SglangSpec
from pvegpu.operations.bench import serving_benchmark
from pvegpu.plan.bench import (
    BenchRow,
    bench_argv,
    history_line,
    parse_results,
    results_table,
)
from pvegpu.plan.errors import PlanError
from tests.unit.op_harness import run_op

# Synthesized in the JSONL shape of sglang.benchmark.serving (knowledge file section 1.4); extra keys ignored.
LINE = json.dumps(
    {
        "backend": "sglang-oai-chat", "max_concurrency": 8, "completed": 32, "duration": 40.0,
        "output_throughput": 812.5, "request_throughput": 0.8, "median_ttft_ms": 410.25, "p99_ttft_ms": 980.0,
        "median_itl_ms": 9.75, "mean_ttft_ms": 450.0,
    }
)  # fmt: skip
ROW = BenchRow(8, 32, 812.5, 0.8, 410.25, 980.0, 9.75)


def test_argv_offline_dataset_full_names() -> None:
    argv = bench_argv(BenchSpec(), SglangSpec(), "http://127.0.0.1:30000", 8, "/var/lib/pvegpu/bench/r.jsonl")
    assert argv == (
        "/opt/sglang/venv/bin/python", "-m", "sglang.benchmark.serving", "--backend", "sglang-oai-chat",
        "--base-url", "http://127.0.0.1:30000", "--model", "glm-5", "--tokenizer", "/models/GLM-5-NVFP4",
        "--dataset-name", "random-ids", "--num-prompts", "32", "--max-concurrency", "8",
        "--random-input-len", "1024", "--random-output-len", "1024",
        "--output-file", "/var/lib/pvegpu/bench/r.jsonl",
    )  # fmt: skip


def test_parse_table_history() -> None:
    rows = parse_results([LINE, ""])
    assert rows == (ROW,)
    assert results_table("gpu-vm", "20260101T000000Z", rows).splitlines()[-1] == (
        "| 8 | 32 | 812.5 | 0.80 | 410.2 | 980.0 | 9.75 |"
    )
    assert json.loads(history_line("gpu-vm", "r1", rows)) == {
        "host": "gpu-vm",
        "run": "r1",
        "rows": [
            {"concurrency": 8, "completed": 32, "output_throughput": 812.5, "request_throughput": 0.8,
             "median_ttft_ms": 410.25, "p99_ttft_ms": 980.0, "median_itl_ms": 9.75}
        ],
    }  # fmt: skip


def test_error_result_line_named() -> None:
    without_itl = {key: value for key, value in json.loads(LINE).items() if key != "median_itl_ms"}
    with pytest.raises(
        PlanError, match=r"^benchmark result line 2: not a result object \('median_itl_ms'\)$"
    ):
        parse_results([LINE, json.dumps(without_itl)])


def test_plot_is_a_png_of_the_declared_size_with_both_panels() -> None:
    rows = [ROW, BenchRow(32, 128, 1500.0, 1.2, 900.0, 2000.0, 20.0)]
    png = plot_png(rows)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(io.BytesIO(png))
    assert pixels.shape[:2] == (int(HEIGHT_IN * DPI), int(WIDTH_IN * DPI))
    colors = {tuple(round(channel * 255) for channel in pixel[:3]) for row in pixels for pixel in row}
    assert {(31, 119, 180), (214, 39, 40), (255, 127, 14)} <= colors  # throughput, TTFT, ITL lines
    assert plot_png(rows) == png  # deterministic: no timestamp
    with pytest.raises(PlanError, match="no benchmark results to plot"):
        plot_png([])


def test_error_concurrency_not_increasing() -> None:
    with pytest.raises(InventoryError) as error:
        validate_inventory(
            [("h", {"node": {"name": "h", "gpus": {"ids": ["10de:2bb1"]}}, "bench": {"concurrency": [8, 1]}})]
        )
    assert error.value.problems == (
        "h: bench.concurrency: must be increasing whole numbers of at least 1 (got [8, 1])",
    )


def test_serving_benchmark_command_reads_the_api_key_from_its_file_on_the_host() -> None:
    argv = (
        "/opt/sglang/venv/bin/python",
        "-m",
        "sglang.benchmark.serving",
        "--base-url",
        "http://127.0.0.1:30000",
    )
    commands, noops = run_op(serving_benchmark, {}, argv=argv, api_key_file="/etc/pvegpu/sglang api-key")
    assert commands == [
        "OPENAI_API_KEY=$(cat '/etc/pvegpu/sglang api-key' ) /opt/sglang/venv/bin/python -m "
        "sglang.benchmark.serving --base-url http://127.0.0.1:30000"
    ]
    assert noops == []
    assert run_op(serving_benchmark, {}, argv=argv)[0] == [" ".join(argv)]
