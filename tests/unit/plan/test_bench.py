"""The serving benchmark's pure parts: argv, result parsing, table, history line, PNG plots, BenchSpec; the
settings each run is labelled with and the comparison of the latest run of each setting."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

import pytest
from matplotlib.image import imread

from pvegpu.cli.bench_report import DPI, HEIGHT_IN, WIDTH_IN, comparison_png, plot_png, write_reports
from pvegpu.inventory.validate import validate_inventory
from pvegpu.models.bench import BenchSpec
from pvegpu.models.errors import InventoryError
from pvegpu.models.p2p import Identity, Record
from pvegpu.models.sglang import SglangSpec
from pvegpu.operations.bench import bench_clock, serving_benchmark
from pvegpu.plan.bench import (
    BASELINE,
    BenchCell,
    BenchRow,
    SpeedSettings,
    bench_argv,
    bench_cells,
    compared_runs,
    comparison_table,
    history_line,
    parse_history,
    parse_results,
    plan_bench,
    results_table,
    speed_settings,
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
    cell = BenchCell(8, 128, 0)
    argv = bench_argv(
        BenchSpec(), SglangSpec(), "http://127.0.0.1:30000", cell, "/var/lib/pvegpu/bench/r.jsonl"
    )
    assert argv == (
        "/opt/sglang/venv/bin/python", "-m", "sglang.benchmark.serving", "--backend", "sglang-oai-chat",
        "--base-url", "http://127.0.0.1:30000", "--model", "glm-5", "--tokenizer", "/models/GLM-5-NVFP4",
        "--dataset-name", "random-ids", "--num-prompts", "32", "--max-concurrency", "8",
        "--random-input-len", "128", "--random-output-len", "1024",
        "--output-file", "/var/lib/pvegpu/bench/r.jsonl",
    )  # fmt: skip


def test_cells_are_the_reference_matrix_by_default() -> None:
    assert bench_cells(BenchSpec()) == (
        *(BenchCell(level, 128, 0) for level in (1, 2, 4, 8, 16, 32, 64)),
        BenchCell(1, 16384, 16384), BenchCell(1, 32768, 32768), BenchCell(1, 65536, 65536),
    )  # fmt: skip
    assert bench_cells(BenchSpec(concurrency=(1, 4), contexts=())) == (
        BenchCell(1, 128, 0),
        BenchCell(4, 128, 0),
    )
    assert [cell.describe() for cell in bench_cells(BenchSpec(concurrency=(2,), contexts=(4096,)))] == [
        "concurrency 2",
        "1 request with 4096 prompt tokens",
    ]


def test_plan_bench_gives_each_cell_its_argv_against_the_probed_host_and_port() -> None:
    plan = plan_bench(
        BenchSpec(concurrency=(2,), contexts=()),
        SglangSpec(host="0.0.0.0", port=31000, api_key_file="/etc/pvegpu/api-key"),
        "/r.jsonl",
    )
    assert plan.runs == (
        (
            BenchCell(2, 128, 0),
            (
                "/opt/sglang/venv/bin/python", "-m", "sglang.benchmark.serving",
                "--backend", "sglang-oai-chat", "--base-url", "http://127.0.0.1:31000",
                "--model", "glm-5", "--tokenizer", "/models/GLM-5-NVFP4",
                "--dataset-name", "random-ids", "--num-prompts", "8", "--max-concurrency", "2",
                "--random-input-len", "128", "--random-output-len", "1024", "--output-file", "/r.jsonl",
            ),
        ),
    )  # fmt: skip


def test_error_contexts_must_be_above_the_prompt() -> None:
    with pytest.raises(InventoryError) as caught:
        validate_inventory(
            [("h", {"node": {"name": "h", "gpus": {"ids": ["10de:2bb1"]}}, "bench": {"contexts": [64]}})]
        )
    assert caught.value.problems == ("h: bench: contexts: 64 is not above input_len 128",)


def test_parse_table_history() -> None:
    rows = parse_results([LINE, ""], 1024)
    assert rows == (ROW,)
    assert results_table("gpu-vm", "20260101T000000Z", rows, BASELINE).splitlines() == [
        "# SGLang serving benchmark: gpu-vm, run 20260101T000000Z",
        "",
        "Settings in force: numa flat, topo file off, p2p off.",
        "",
        "| context | concurrency | requests | output tok/s | requests/s | median TTFT ms | p99 TTFT ms "
        "| median ITL ms | accept length |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| 0 | 8 | 32 | 812.5 | 0.80 | 410.2 | 980.0 | 9.75 | - |",
    ]
    assert json.loads(history_line("gpu-vm", "r1", rows, BASELINE)) == {
        "host": "gpu-vm",
        "run": "r1",
        "settings": {"numa": "flat", "topo_file": "off", "p2p": "off"},
        "rows": [
            {"concurrency": 8, "completed": 32, "output_throughput": 812.5, "request_throughput": 0.8,
             "median_ttft_ms": 410.25, "p99_ttft_ms": 980.0, "median_itl_ms": 9.75, "context": 0,
             "accept_length": None}
        ],
    }  # fmt: skip


def test_error_result_line_named() -> None:
    without_itl = {key: value for key, value in json.loads(LINE).items() if key != "median_itl_ms"}
    with pytest.raises(
        PlanError, match=r"^benchmark result line 2: not a result object \('median_itl_ms'\)$"
    ):
        parse_results([LINE, json.dumps(without_itl)], 1024)


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
    clock = {"clock": "/var/lib/pvegpu/bench/r7.started", "budget_s": 3600}
    commands, noops = run_op(
        serving_benchmark, {}, argv=argv, api_key_file="/etc/pvegpu/sglang api-key", **clock
    )
    assert commands == [
        "if [ $(( $(date +%s) - $(cat /var/lib/pvegpu/bench/r7.started ) )) -lt 3600 ]; then "
        "OPENAI_API_KEY=$(cat '/etc/pvegpu/sglang api-key' ) /opt/sglang/venv/bin/python -m "
        "sglang.benchmark.serving --base-url http://127.0.0.1:30000 "
        "; else echo 'pvegpu: skipped: bench.max_minutes spent'; fi"
    ]
    assert noops == []
    assert run_op(serving_benchmark, {}, argv=argv, **clock)[0] == [
        "if [ $(( $(date +%s) - $(cat /var/lib/pvegpu/bench/r7.started ) )) -lt 3600 ]; then "
        f"{' '.join(argv)} ; else echo 'pvegpu: skipped: bench.max_minutes spent'; fi"
    ]
    clock_commands = run_op(
        bench_clock, {}, path="/var/lib/pvegpu/bench/r7.started", results="/var/lib/pvegpu/bench/r7.jsonl"
    )[0]
    assert clock_commands == [
        "date +%s > /var/lib/pvegpu/bench/r7.started",
        "touch /var/lib/pvegpu/bench/r7.jsonl",
    ]


IDENTITY = Identity(driver="580.95.05", kernel="6.8.12-4-pve", devices="hostpci0=mapping=gpu0")
PASSED, FORCED = Record("probe", "p2p", IDENTITY), Record("on", "p2p", IDENTITY)
FAILED = Record("probe", "shm", IDENTITY, ("0<->1: checksum",))
UNKNOWN = SpeedSettings("host", "unknown", "unknown")


@pytest.mark.parametrize(
    ("shown", "settings"),
    [
        ({"numa_nodes": 1}, SpeedSettings("flat", "off", "off")),
        ({"numa_nodes": 2}, SpeedSettings("host", "off", "off")),
        ({"numa_nodes": 2, "topo_file_read": True}, SpeedSettings("host", "on", "off")),
        ({"p2p_in_use": True, "p2p_record": PASSED}, SpeedSettings("flat", "off", "probe-passed")),
        ({"p2p_in_use": True, "p2p_record": FORCED}, SpeedSettings("flat", "off", "on")),
        ({"p2p_in_use": True}, SpeedSettings("flat", "off", "on")),  # bare metal's own P2P: no probe
        ({"p2p_record": FAILED}, SpeedSettings("flat", "off", "off")),
        ({"numa_nodes": 2, "nccl_logged": False, "topo_file_read": True}, UNKNOWN),
    ],
)
def test_settings_label_what_the_serving_host_shows(
    shown: dict[str, object], settings: SpeedSettings
) -> None:
    inputs: dict[str, object] = {"numa_nodes": 1, "nccl_logged": True, "topo_file_read": False}
    inputs |= {"p2p_in_use": False, "p2p_record": None}
    assert speed_settings(**{**inputs, **shown}) == settings  # type: ignore[arg-type]


def saved(
    run_id: str, settings: SpeedSettings | None, single: float, peak: float, host: str = "gpu-vm"
) -> str:
    rows = (BenchRow(1, 4, single, 0.1, 90.0, 99.0, 9.0), BenchRow(32, 128, peak, 1.0, 900.0, 990.0, 60.0))
    if settings is None:  # a line saved before runs were labelled
        return json.dumps({"run": run_id, "host": host, "rows": [asdict(row) for row in rows]})
    return history_line(host, run_id, rows, settings)


NUMA = SpeedSettings("host", "off", "off")
TOPO = SpeedSettings("host", "on", "off")
P2P = SpeedSettings("host", "on", "probe-passed")
HISTORY = [
    saved("r0", None, 9.0, 400.0),
    saved("r1", TOPO, 10.0, 500.0),
    saved("r2", BASELINE, 11.0, 485.0),
    saved("r3", NUMA, 12.1, 520.0),
    saved("r4", TOPO, 13.2, 600.0),
    saved("r5", P2P, 104.5, 1164.0),
    saved("r6", BASELINE, 50.0, 50.0, host="other-vm"),
]


def test_comparison_latest_run_of_each_setting_baseline_first_then_by_step() -> None:
    runs = compared_runs("gpu-vm", parse_history(HISTORY))
    assert [(r.run, r.settings) for r in runs] == [("r2", BASELINE), ("r3", NUMA), ("r4", TOPO), ("r5", P2P)]
    assert comparison_table("gpu-vm", runs).splitlines() == [
        "# What each VM speed setting bought: gpu-vm",
        "",
        "The latest run of each setting; change against the baseline (numa flat, topo file off, p2p off).",
        "",
        "| numa | topo file | p2p | run | tok/s at 1 | change | tok/s at 32 | change |",
        "|---|---|---|---|---:|---:|---:|---:|",
        "| flat | off | off | r2 | 11.0 | baseline | 485.0 | baseline |",
        "| host | off | off | r3 | 12.1 | +10.0% | 520.0 | +7.2% |",
        "| host | on | off | r4 | 13.2 | +20.0% | 600.0 | +23.7% |",
        "| host | on | probe-passed | r5 | 104.5 | +850.0% | 1164.0 | +140.0% |",
    ]


def test_comparison_without_baseline_or_a_level_shows_dashes() -> None:
    unknown = SpeedSettings("flat", "unknown", "unknown")
    only_level_1 = history_line("gpu-vm", "r9", [BenchRow(1, 4, 8.0, 0.1, 1, 1, 1)], unknown)
    runs = compared_runs("gpu-vm", parse_history([HISTORY[3], only_level_1]))
    assert comparison_table("gpu-vm", runs).splitlines()[2:] == [
        "No baseline run (numa flat, topo file off, p2p off) yet: the changes against it are `-`.",
        "",
        "| numa | topo file | p2p | run | tok/s at 1 | change | tok/s at 32 | change |",
        "|---|---|---|---|---:|---:|---:|---:|",
        "| host | off | off | r3 | 12.1 | - | 520.0 | - |",
        "| flat | unknown | unknown | r9 | 8.0 | - | - | - |",
    ]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{", "benchmark history line 1: not a run pvegpu saved (Expecting property name enclosed in double "
              "quotes: line 1 column 2 (char 1))"),
        (saved("r1", TOPO, 1.0, 2.0).replace('"on"', '"maybe"'),
         "benchmark history line 1: not a run pvegpu saved (setting 'maybe' is none of off, on, unknown)"),
        ('{"run": "r", "host": "h", "rows": [{"concurrency": 1}]}',
         "benchmark history line 1: not a run pvegpu saved (BenchRow.__init__() missing 6 required "
         "positional arguments: 'completed', 'output_throughput', 'request_throughput', 'median_ttft_ms', "
         "'p99_ttft_ms', and 'median_itl_ms')"),
    ],
)  # fmt: skip
def test_error_history_line_named(line: str, problem: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_history([line])
    assert str(caught.value) == problem


def test_comparison_plot_is_a_png_of_the_declared_size_with_baseline_and_settings_bars() -> None:
    runs = compared_runs("gpu-vm", parse_history(HISTORY))
    png = comparison_png("gpu-vm", runs)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(io.BytesIO(png))
    assert pixels.shape[:2] == (int(HEIGHT_IN * DPI), int(WIDTH_IN * DPI))
    colors = {tuple(round(channel * 255) for channel in pixel[:3]) for row in pixels for pixel in row}
    assert {(127, 127, 127), (31, 119, 180)} <= colors  # the baseline's grey bar, the settings' blue ones
    assert comparison_png("gpu-vm", runs) == png
    with pytest.raises(PlanError, match=r"^no labelled benchmark runs to compare$"):
        comparison_png("gpu-vm", ())


def test_write_reports_adds_the_run_and_rewrites_the_comparison(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.write_text("".join(line.rstrip("\n") + "\n" for line in HISTORY[:3]))
    local = tmp_path / "gpu-vm" / "r7.jsonl"
    local.parent.mkdir()
    local.write_text(LINE + "\n")

    write_reports(
        local, "gpu-vm", "r7", history=history, settings=P2P, bench=BenchSpec(input_len=1024, contexts=())
    )

    assert (tmp_path / "gpu-vm" / "r7.md").read_text().splitlines()[2] == (
        "Settings in force: numa host, topo file on, p2p probe-passed."
    )
    assert (tmp_path / "gpu-vm" / "r7.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [run.run for run in parse_history(history.read_text().splitlines())] == ["r0", "r1", "r2", "r7"]
    assert (tmp_path / "gpu-vm" / "compare.md").read_text().splitlines()[4:] == [
        "| numa | topo file | p2p | run | tok/s at 1 | change | tok/s at 8 | change | tok/s at 32 | change |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
        "| flat | off | off | r2 | 11.0 | baseline | - | baseline | 485.0 | baseline |",
        "| host | on | off | r1 | 10.0 | -9.1% | - | - | 500.0 | +3.1% |",
        "| host | on | probe-passed | r7 | - | - | 812.5 | - | - | - |",
    ]
    runs = compared_runs("gpu-vm", parse_history(history.read_text().splitlines()))
    assert (tmp_path / "gpu-vm" / "compare.png").read_bytes() == comparison_png("gpu-vm", runs)
