"""bench: SGLang's serving benchmark on the serving host at each concurrency level, results fetched and
reported on the operator's machine: `<results_dir>/<host>/<run>.jsonl` (the tool's own output),
`<run>.md` (table), `<run>.png` (plot), and one line per run in `<results_dir>/history.jsonl`, labelled with
the VM speed settings in force (`pvegpu.plan.bench.SpeedSettings`, read from the serving host before the run:
`pvegpu.run.serving.settings_in_force`); `<results_dir>/<host>/compare.md|.png` compare the latest run of
each setting on that host, and `<results_dir>/<host>/vs-reference.md|.png` set the run beside the reference
box's published figures. The run takes at most `bench.max_minutes` (on the serving host's clock): a cell not
started by then is skipped.

Not idempotent by nature: every run measures again and adds a run to the history.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host
from pyinfra.operations import files, python

from pvegpu.cli.bench_report import write_reports
from pvegpu.operations.bench import bench_clock, serving_benchmark
from pvegpu.run.plan import plan_of
from pvegpu.run.serving import bench_plan_of, settings_in_force

REMOTE_DIR = "/var/lib/pvegpu/bench"


@deploy("Benchmark SGLang")
def bench() -> None:
    """One benchmark run per concurrency level, then fetch and report."""
    specs = plan_of(host).specs
    spec, sglang = specs.bench, specs.sglang
    settings = settings_in_force(host)
    logger.info(f"{host.print_prefix}benchmark settings in force: {settings.describe()}")
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    remote = f"{REMOTE_DIR}/{run_id}.jsonl"
    results = Path(spec.results_dir).resolve()
    local = results / host.name / f"{run_id}.jsonl"
    clock = f"{REMOTE_DIR}/{run_id}.started"
    run = bench_plan_of(host, remote)
    files.directory(name=f"Create {REMOTE_DIR}", path=REMOTE_DIR)
    bench_clock(
        name=f"Start the run's clock ({spec.max_minutes} minutes for {len(run.runs)} cells)",
        path=clock,
        results=remote,
    )
    for cell, argv in run.runs:
        serving_benchmark(
            name=f"Run SGLang's serving benchmark: {cell.describe()}",
            argv=argv,
            clock=clock,
            budget_s=spec.max_minutes * 60,
            api_key_file=sglang.api_key_file,
        )
    files.get(
        name="Fetch the results", src=remote, dest=str(local), add_deploy_dir=False, create_local_dir=True
    )
    python.call(
        name="Write the table, plot, history and comparison with the reference",
        function=write_reports,
        local=local,
        host_name=host.name,
        run_id=run_id,
        history=results / "history.jsonl",
        settings=settings,
        bench=spec,
    )
