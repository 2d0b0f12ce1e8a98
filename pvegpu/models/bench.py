"""The serving benchmark an operator asks for: host data key `bench` (deploy/bench.py).

("gpu-vm", {"node": {...}, "bench": {"concurrency": [1, 64], "output_len": 512}})

The defaults are the reference box's matrix (pvegpu/data/bench/reference_glm5_sm120.json): concurrency 1 to
64 with a short prompt ("context 0"), then one request at a time with 16k, 32k and 64k prompt tokens.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

BENCH_KEY = "bench"


def _increasing(levels: tuple[int, ...]) -> tuple[int, ...]:
    if not levels:
        raise ValueError("must list at least one concurrency")
    if any(level < 1 for level in levels) or list(levels) != sorted(set(levels)):
        raise ValueError(f"must be increasing whole numbers of at least 1 (got {list(levels)})")
    return levels


def _contexts(contexts: tuple[int, ...]) -> tuple[int, ...]:
    if any(context < 1 for context in contexts) or list(contexts) != sorted(set(contexts)):
        raise ValueError(f"must be increasing whole numbers of at least 1 (got {list(contexts)})")
    return contexts


class BenchSpec(BaseModel):
    """SGLang's serving benchmark (`python -m sglang.benchmark.serving`, offline dataset `random-ids`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    concurrency: Annotated[tuple[StrictInt, ...], AfterValidator(_increasing)] = Field(
        default=(1, 2, 4, 8, 16, 32, 64),
        description=(
            "Request concurrency levels to measure with `input_len` prompts, increasing "
            "(`--max-concurrency`); the default is the reference box's matrix."
        ),
    )
    contexts: Annotated[tuple[StrictInt, ...], AfterValidator(_contexts)] = Field(
        default=(16384, 32768, 65536),
        description=(
            "Prompt lengths in tokens for single-request runs after the levels (long-context decode), "
            "increasing, each above `input_len`; () for none."
        ),
    )
    max_minutes: StrictInt = Field(
        default=60,
        ge=1,
        description=(
            "Time budget of one run: a level or context not started within it is skipped, and the reports "
            "say so."
        ),
    )
    prompts_per_level: StrictInt = Field(
        default=4,
        ge=1,
        description="Requests per unit of concurrency (`--num-prompts` = this x concurrency).",
    )
    input_len: StrictInt = Field(
        default=128,
        ge=1,
        description=(
            "Prompt tokens of the concurrency levels (`--random-input-len`): short, as the reference's "
            "context 0."
        ),
    )
    output_len: StrictInt = Field(default=1024, ge=1, description="Generated tokens (`--random-output-len`).")
    results_dir: str = Field(
        default="bench-results",
        min_length=1,
        description=(
            "Directory on the operator's machine for `<host>/<run>.jsonl|.md|.png` and `history.jsonl` "
            "(relative: to where pyinfra runs)."
        ),
    )

    @model_validator(mode="after")
    def _contexts_above_input(self) -> BenchSpec:
        if self.contexts and self.contexts[0] <= self.input_len:
            raise ValueError(f"contexts: {self.contexts[0]} is not above input_len {self.input_len}")
        return self
