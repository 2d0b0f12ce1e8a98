"""The SGLang service's readiness target per rank (pvegpu.plan.sglang_service.probe_target)."""

from __future__ import annotations

import pytest

from pvegpu.models.sglang import ProbeTarget, SglangSpec
from pvegpu.plan.sglang_service import probe_target

KEY = "/etc/pvegpu/sglang-api-key"
PYTHON = "/opt/sglang/venv/bin/python"


@pytest.mark.parametrize(
    ("sglang", "expected"),
    [
        ({}, ProbeTarget(PYTHON, "http://127.0.0.1:30000", None)),
        ({"host": "0.0.0.0", "api_key_file": KEY}, ProbeTarget(PYTHON, "http://127.0.0.1:30000", KEY)),
        ({"host": "::", "api_key_file": KEY, "port": 8000}, ProbeTarget(PYTHON, "http://[::1]:8000", KEY)),
        # Rank 0 of two serves the API: the usual probe.
        ({"host": "0.0.0.0", "api_key_file": KEY, "nnodes": 2, "dist_init_addr": "10.0.0.1:5000"},
         ProbeTarget(PYTHON, "http://127.0.0.1:30000", KEY)),
        # Rank 1: its health server, then rank 0's /health at dist_init_addr's host on the shared port.
        ({"host": "0.0.0.0", "api_key_file": KEY, "nnodes": 2, "node_rank": 1,
          "dist_init_addr": "10.0.0.1:5000"},
         ProbeTarget(PYTHON, "http://127.0.0.1:30000", None, "http://10.0.0.1:30000")),
        ({"nnodes": 4, "node_rank": 3, "dist_init_addr": "[fd00::1]:5000", "port": 8000},
         ProbeTarget(PYTHON, "http://127.0.0.1:8000", None, "http://[fd00::1]:8000")),
    ],
)  # fmt: skip
def test_probe_target_per_rank(sglang: dict[str, object], expected: ProbeTarget) -> None:
    assert probe_target(SglangSpec.model_validate(sglang)) == expected


def test_what_answering_means_per_rank() -> None:
    assert ProbeTarget(PYTHON, "http://127.0.0.1:30000", KEY).answers == (
        "http://127.0.0.1:30000/health and /v1/models"
    )
    assert ProbeTarget(PYTHON, "http://127.0.0.1:30000", None, "http://10.0.0.1:30000").answers == (
        "http://127.0.0.1:30000/health, and rank 0 http://10.0.0.1:30000/health"
    )
