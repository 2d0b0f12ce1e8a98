"""`serving_benchmark`: one cell of SGLang's serving benchmark on the serving host, within the run's time
budget (`bench_clock` starts it)."""

from __future__ import annotations

import shlex
from collections.abc import Generator, Sequence

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation

# What a cell prints instead of running when the budget is spent (the reports say which cells).
SKIPPED = "pvegpu: skipped: bench.max_minutes spent"


@operation(is_idempotent=False, idempotent_notice="A benchmark measures again on every run.")
def bench_clock(path: str, results: str) -> Generator[StringCommand, None, None]:
    """Write the serving host's clock (epoch seconds) to `path`: the run's start, which each cell's budget
    counts from on the same clock; and create the `results` file the cells append to (there to fetch even
    when no cell ran)."""
    yield StringCommand("date +%s >", QuoteString(path))
    yield StringCommand("touch", QuoteString(results))


@operation(is_idempotent=False, idempotent_notice="A benchmark measures again on every run.")
def serving_benchmark(
    argv: Sequence[str], clock: str, budget_s: int, api_key_file: str | None = None
) -> Generator[StringCommand, None, None]:
    """Run `argv` (from `pvegpu.plan.bench.bench_argv`) when fewer than `budget_s` seconds have passed since
    the time in `clock`; else print SKIPPED. With `api_key_file` the benchmark reads the key from
    OPENAI_API_KEY, filled from the file on the host: the command line holds only the file's path."""
    key = ("OPENAI_API_KEY=$(cat", QuoteString(api_key_file), ")") if api_key_file else ()
    yield StringCommand(
        "if [ $(( $(date +%s) - $(cat",
        QuoteString(clock),
        f") )) -lt {budget_s} ]; then",
        *key,
        *map(QuoteString, argv),
        f"; else echo {shlex.quote(SKIPPED)}; fi",
    )
