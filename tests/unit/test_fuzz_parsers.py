"""Fuzzed parsers (tests/unit/fuzz_targets.py): random lines and mutated real samples; only the parser's
own error comes out, with a message. A bounded, reproducible number per parser here (derandomized, no
example database); `scripts/fuzz.py` runs 10,000 per parser."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.fuzz_targets import TARGETS, Target, crash, inputs


@pytest.mark.parametrize("target", TARGETS, ids=[target.name.split(" (")[0] for target in TARGETS])
@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_only_the_parse_error_comes_out(target: Target, data: st.DataObject) -> None:
    lines = data.draw(inputs(target))
    assert crash(target, lines) is None, lines


def test_every_target_has_a_sample() -> None:
    assert all(target.seeds and all(target.seeds) for target in TARGETS)
