"""bench: SGLang's serving benchmark on the serving host at each concurrency level, results fetched and
reported on the operator's machine: `<results_dir>/<host>/<run>.jsonl` (the tool's own output),
`<run>.md` (table), `<run>.png` (plot), and one line per run in `<results_dir>/history.jsonl`.

Not idempotent by nature: every run measures again and adds a run to the history.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyinfra.api.deploy import deploy
from pyinfra.context import host
from pyinfra.operations import files, python

from pvegpu.bench_report import write_reports
from pvegpu.models.specs import host_specs
from pvegpu.operations.bench import serving_benchmark
from pvegpu.plan.bench import bench_argv
from pvegpu.plan.sglang_service import probe_host

REMOTE_DIR = "/var/lib/pvegpu/bench"


@deploy("Benchmark SGLang")
def bench() -> None:
    """One benchmark run per concurrency level, then fetch and report."""
    specs = host_specs(host.data)
    spec, sglang = specs.bench, specs.sglang
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    remote = f"{REMOTE_DIR}/{run_id}.jsonl"
    results = Path(spec.results_dir).resolve()
    local = results / host.name / f"{run_id}.jsonl"
    base_url = f"http://{probe_host(sglang.host)}:{sglang.port}"

    files.directory(name=f"Create {REMOTE_DIR}", path=REMOTE_DIR)
    for level in spec.concurrency:
        argv = bench_argv(spec, sglang, base_url, level, remote)
        serving_benchmark(
            name=f"Run SGLang's serving benchmark at concurrency {level}",
            argv=argv,
            api_key_file=sglang.api_key_file,
        )
    files.get(
        name="Fetch the results", src=remote, dest=str(local), add_deploy_dir=False, create_local_dir=True
    )
    python.call(
        name="Write the table, plot and history",
        function=write_reports,
        local=local,
        host_name=host.name,
        run_id=run_id,
        history=results / "history.jsonl",
    )
