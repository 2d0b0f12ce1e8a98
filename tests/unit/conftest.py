"""Unit tier: what the tests leave behind is cleaned up at the end of the session.

The pvesh stand-in's running VM is a real process (lab/pve/pvesh.py `_start_placeholder`), which ends on
its own once its pidfile is gone; a test that starts a VM and never stops it leaves its pidfile in the
session's temporary directory, which pytest keeps for a while. Such processes are ended here.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit import fake_pve


@pytest.fixture(scope="session", autouse=True)
def _end_stand_in_vms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    base = str(tmp_path_factory.getbasetemp())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"/usr/bin/kvm", b"-c"] and f"f='{base}/".encode() in argv[2]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGTERM)


@pytest.fixture(autouse=True)
def _fixed_create_nonce(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.pve_guest.new_nonce", lambda: fake_pve.NONCE)
