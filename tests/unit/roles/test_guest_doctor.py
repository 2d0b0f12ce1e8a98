"""roles/guest_doctor.py: the lines a VM guest's doctor logs of its next boot (pvegpu/run/reports.py
`log_next_boot`, which the node's doctor shares), from the guest's `NextBoot` read; nothing on a host whose
driver is not the guest's own, nor before DKMS built the pinned driver for any kernel."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host

from pvegpu.facts.next_boot import NextBoot
from pvegpu.models.boot import KernelBoot
from roles import guest_doctor
from tests.unit.op_harness import FakeHost

DRIVER = "590.48.01"
RUNNING = "6.12.48+deb13-amd64"
UPDATE = "6.12.57+deb13-amd64"


def guest_plan(profile: str = "vm", driver: str = "guest") -> SimpleNamespace:
    """What the role reads of the host's plan (pvegpu/plan/node.py `NodePlan`)."""
    specs = SimpleNamespace(node=SimpleNamespace(profile=profile), driver=SimpleNamespace(version=DRIVER))
    return SimpleNamespace(specs=specs, serving=SimpleNamespace(driver=driver))


def logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, plan: SimpleNamespace, boot: KernelBoot
) -> list[tuple[str, str]]:
    """(level, line) per line the role logs on guest `pve1` with `plan` and the next boot read `boot`."""
    monkeypatch.setattr(guest_doctor, "plan_of", lambda _host: plan)
    caplog.clear()
    with ctx_host.use(FakeHost({NextBoot: boot})), caplog.at_level(logging.INFO, logger="pyinfra"):
        guest_doctor.guest_next_boot._inner()
    return [(record.levelname, record.getMessage()) for record in caplog.records]


def test_noop_next_kernel_with_the_module_is_one_info_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    boot = KernelBoot(RUNNING, (RUNNING,), None, None, {RUNNING: (DRIVER,)})
    assert logged(monkeypatch, caplog, guest_plan(), boot) == [
        ("INFO", f"[pve1] next boot: kernel {RUNNING}: NVIDIA module {DRIVER} built by DKMS"),
    ]


def test_error_next_kernel_without_the_module_is_a_warning_with_debians_fix(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    boot = KernelBoot(RUNNING, (RUNNING, UPDATE), None, None, {RUNNING: (DRIVER,)})
    assert logged(monkeypatch, caplog, guest_plan(), boot) == [
        (
            "WARNING",
            f"[pve1] next boot: kernel {UPDATE} (next boot) has no NVIDIA module {DRIVER} built by DKMS "
            f"(built: none): apt install linux-headers-{UPDATE}, then dkms autoinstall -k {UPDATE}; or keep "
            f"booting {RUNNING} (GRUB_DEFAULT)",
        ),
    ]


def test_noop_nothing_said_before_the_driver_is_installed_nor_off_a_guest_driver(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bare = KernelBoot(RUNNING, (RUNNING, UPDATE), None, None, {})
    assert logged(monkeypatch, caplog, guest_plan(), bare) == []
    built = KernelBoot(RUNNING, (RUNNING, UPDATE), None, None, {RUNNING: (DRIVER,)})
    assert logged(monkeypatch, caplog, guest_plan(driver="host"), built) == []
    assert logged(monkeypatch, caplog, guest_plan(profile="lxc"), built) == []
