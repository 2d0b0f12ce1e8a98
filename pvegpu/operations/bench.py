"""`serving_benchmark`: one run of SGLang's serving benchmark on the serving host."""

from __future__ import annotations

from collections.abc import Generator, Sequence

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.operation import operation


@operation(is_idempotent=False, idempotent_notice="A benchmark measures again on every run.")
def serving_benchmark(
    argv: Sequence[str], api_key_file: str | None = None
) -> Generator[StringCommand, None, None]:
    """Run `argv` (from `pvegpu.plan.bench.bench_argv`). With `api_key_file` the benchmark reads the key from
    OPENAI_API_KEY, filled from the file on the host: the command line holds only the file's path."""
    key = ("OPENAI_API_KEY=$(cat", QuoteString(api_key_file), ")") if api_key_file else ()
    yield StringCommand(*key, *map(QuoteString, argv))
