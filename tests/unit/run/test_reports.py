"""pvegpu/run/reports.py: a report's findings as log lines of their level, and the node doctor's host checks
written as JSON on the operator's machine."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from pvegpu.models.doctor import Finding
from pvegpu.plan.host_checks import Check
from pvegpu.run.reports import REPORT_DIR_ENV, log_findings, save_host_checks
from tests.unit.op_harness import FakeHost


def test_findings_logged_with_the_host_prefix_at_their_level(caplog: pytest.LogCaptureFixture) -> None:
    host: Any = FakeHost({})
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        log_findings(host, (Finding("VM 100: fine"), Finding("VM 100: vm.mmio: too small", warning=True)))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "[pve1] VM 100: fine"),
        ("WARNING", "[pve1] VM 100: vm.mmio: too small"),
    ]


def test_host_checks_saved_as_json_per_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path / "reports"))
    host: Any = FakeHost({})
    path = save_host_checks(host, (Check("IOMMU", "ok", "on"),))
    assert path == tmp_path / "reports" / "pve1.json"
    assert json.loads(path.read_text()) == {
        "host": "pve1",
        "checks": [{"check": "IOMMU", "state": "ok", "detail": "on"}],
    }
