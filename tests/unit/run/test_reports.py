"""pvegpu/run/reports.py: a report's findings as log lines of their level, and the node doctor's host checks
written as JSON on the operator's machine."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pvegpu.models.doctor import Finding
from pvegpu.models.nccl import ChannelTransport, Transport
from pvegpu.plan.host_checks import Check
from pvegpu.plan.nccl_transports import check_transports
from pvegpu.run import reports
from pvegpu.run.reports import REPORT_DIR_ENV, log_findings, nccl_transport_findings, save_host_checks
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


def test_nccl_transport_findings_pairs_then_a_warning_per_pair_against_the_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p2p = ChannelTransport(
        line=5, channel=0, connection=0, src_rank=0, src_device="0", dst_rank=1, dst_device="1",
        direction=None, transport=Transport.P2P, detail="P2P/CUMEM/read",
    )  # fmt: skip
    specs = SimpleNamespace(node=SimpleNamespace(profile="vm"), sglang=SimpleNamespace(nnodes=1))
    monkeypatch.setattr(reports, "plan_of", lambda _host: SimpleNamespace(specs=specs))
    monkeypatch.setattr(reports, "nccl_channels", lambda _host: (p2p,))
    host: Any = FakeHost({})
    warnings = check_transports("vm", (p2p,), single_node=True, p2p=False)
    assert warnings  # P2P on a VM whose plan does not use it
    assert nccl_transport_findings(host, False) == (
        Finding(
            "NCCL transports of sglang.service (profile vm):\n  ranks 0 -> 1: P2P/CUMEM/read (1 channel)"
        ),
        *(Finding(warning, warning=True) for warning in warnings),
    )


def test_error_nccl_transport_findings_without_a_log_say_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    specs = SimpleNamespace(node=SimpleNamespace(profile="vm"), sglang=SimpleNamespace(nnodes=1))
    monkeypatch.setattr(reports, "plan_of", lambda _host: SimpleNamespace(specs=specs))
    monkeypatch.setattr(reports, "nccl_channels", lambda _host: ())
    host: Any = FakeHost({})
    assert nccl_transport_findings(host, None) == (
        Finding(
            "no NCCL channel lines found: set NCCL_DEBUG=INFO and restart the service to see transports",
            warning=True,
        ),
    )
