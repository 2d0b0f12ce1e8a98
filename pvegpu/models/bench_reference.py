"""The reference box's published serving figures (`pvegpu/data/bench/reference_glm5_sm120.json`), which
`deploy/bench.py` sets beside a node's own: decode tok/s per concurrency at context 0, MTP off and on, and
single-request tok/s per long prompt (a range where the source gives one). Plain data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Reference:
    """`context_0[mtp][concurrency]` tok/s; `single_request[mtp][context]` (low, high) tok/s."""

    name: str
    box: str
    source: str
    context_0: dict[bool, dict[int, float]]
    single_request: dict[bool, dict[int, tuple[float, float]]]

    def figure(self, mtp: bool, concurrency: int, context: int) -> tuple[float, float] | None:
        """The reference's (low, high) tok/s for a cell; None where it published none."""
        if context:
            return self.single_request.get(mtp, {}).get(context) if concurrency == 1 else None
        value = self.context_0.get(mtp, {}).get(concurrency)
        return None if value is None else (value, value)


def _mtp(key: str) -> bool:
    return {"mtp_off": False, "mtp_on": True}[key]


@cache
def load_reference() -> Reference:
    """The shipped reference figures."""
    text = resources.files("pvegpu").joinpath("data", "bench", "reference_glm5_sm120.json").read_text()
    raw = json.loads(text)
    return Reference(
        name=raw["name"],
        box=raw["box"],
        source=raw["source"],
        context_0={
            _mtp(k): {int(c): float(v) for c, v in figures.items()} for k, figures in raw["context_0"].items()
        },
        single_request={
            _mtp(k): {int(c): (float(low), float(high)) for c, (low, high) in figures.items()}
            for k, figures in raw["single_request"].items()
        },
    )
