"""The serving benchmark an operator asks for: host data key `bench` (deploy/bench.py).

("gpu-vm", {"node": {...}, "bench": {"concurrency": [1, 64], "output_len": 512}})
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

BENCH_KEY = "bench"


def _increasing(levels: tuple[int, ...]) -> tuple[int, ...]:
    if not levels:
        raise ValueError("must list at least one concurrency")
    if any(level < 1 for level in levels) or list(levels) != sorted(set(levels)):
        raise ValueError(f"must be increasing whole numbers of at least 1 (got {list(levels)})")
    return levels


class BenchSpec(BaseModel):
    """SGLang's serving benchmark (`python -m sglang.benchmark.serving`, offline dataset `random-ids`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    concurrency: Annotated[tuple[StrictInt, ...], AfterValidator(_increasing)] = Field(
        default=(1, 32),
        description="Request concurrency levels to measure, increasing (`--max-concurrency`), e.g. 1 and N.",
    )
    prompts_per_level: StrictInt = Field(
        default=4,
        ge=1,
        description="Requests per unit of concurrency (`--num-prompts` = this x concurrency).",
    )
    input_len: StrictInt = Field(default=1024, ge=1, description="Prompt tokens (`--random-input-len`).")
    output_len: StrictInt = Field(default=1024, ge=1, description="Generated tokens (`--random-output-len`).")
    results_dir: str = Field(
        default="bench-results",
        min_length=1,
        description=(
            "Directory on the operator's machine for `<host>/<run>.jsonl|.md|.png` and `history.jsonl` "
            "(relative: to where pyinfra runs)."
        ),
    )
