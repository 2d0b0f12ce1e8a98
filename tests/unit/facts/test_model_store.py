"""The model directory's file list (GNU find's output, read here), the fetcher's record and status, and the
look at its unit (on a real capture)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.model_store import (
    FetchLook,
    ModelStoreRead,
    fetch_journal_command,
    fetch_look_command,
    fetch_start_command,
    parse_fetch_look,
    parse_fetch_status,
    parse_model_record,
    parse_store,
    store_command,
)
from pvegpu.models.model_store import FetchStatus, ModelRecord, StoreFile


def test_store_command_on_a_real_tree_gives_pythons_sizes_and_nanosecond_mtimes(tmp_path: Path) -> None:
    (tmp_path / "sub dir").mkdir()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub dir/a b.json").write_text("xyz")
    (tmp_path / ".pvegpu/partial").mkdir(parents=True)
    (tmp_path / ".pvegpu/model.json").write_text("{}")
    (tmp_path / ".pvegpu/partial/x.part").write_text("partial")
    lines = subprocess.run(
        ["sh", "-c", store_command(str(tmp_path))], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    expected = {
        path: StoreFile(os.stat(tmp_path / path).st_size, os.stat(tmp_path / path).st_mtime_ns)
        for path in ("config.json", "sub dir/a b.json")
    }
    assert parse_store(lines) == expected


def test_store_missing_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        ["sh", "-c", store_command(str(tmp_path / "absent"))], check=True, capture_output=True, text=True
    )
    assert parse_store(out.stdout.splitlines()) is None


def test_store_refuses_another_shape() -> None:
    with pytest.raises(FactParseError, match="model store: 'x y' is not"):
        parse_store(["x y"])


def test_record_and_status() -> None:
    text = (
        '{"repo": "a/b", "revision": null, "commit": "c", "complete": true, '
        '"files": {"f": {"size": 3, "mtime_ns": 9, "sha256": null, "blob_id": "x"}}}'
    )
    assert parse_model_record(text) == ModelRecord("a/b", None, "c", True, {"f": StoreFile(3, 9)})
    assert parse_model_record(None) is None
    assert parse_model_record('{"repo": "a/b"}') is None
    assert parse_model_record("{half") is None
    status = '{"state": "running", "done": 5, "total": 10, "time": 1.5}'
    assert parse_fetch_status(status) == FetchStatus("running", 5, 10, None, 1.5)
    assert parse_fetch_status('{"state": "failed"}') is None


def test_the_doctors_read_gives_the_record_and_the_files_of_a_real_tree(tmp_path: Path) -> None:
    (tmp_path / ".pvegpu").mkdir()
    (tmp_path / "config.json").write_text("{}")
    stat = os.stat(tmp_path / "config.json")
    record = {
        "repo": "a/b",
        "revision": "v1",
        "commit": "c" * 40,
        "complete": True,
        "files": {"config.json": {"size": 2, "mtime_ns": stat.st_mtime_ns, "sha256": None, "blob_id": "x"}},
    }
    (tmp_path / ".pvegpu/model.json").write_text(json.dumps(record))
    fact = ModelStoreRead()
    shell = subprocess.run(
        ["sh", "-c", fact.command(str(tmp_path))], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    files = {"config.json": StoreFile(2, stat.st_mtime_ns)}
    assert fact.process(shell) == (ModelRecord("a/b", "v1", "c" * 40, True, files), files)
    (tmp_path / ".pvegpu/model.json").unlink()
    shell = subprocess.run(
        ["sh", "-c", fact.command(str(tmp_path / "absent"))], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert fact.process(shell) == (None, None)


# A look at the lab VM guest's fetch unit after the demo, over SSH (2026-12-03): status.json, then
# `systemctl show --property ActiveState --property Result pvegpu-model-fetch.service` (systemd 252 prints
# Result first).
LOOK = (
    '{"state": "verified", "done": 24320865, "total": 24320865, "message": "festr2/GLM-5-NVFP4-MTP@22421ef230'
    '7503bcaa146f585e3de67f4dc44d77: 4 files, 24.3 MB, verified", "time": 1796334153.0879157}',
    "Result=success",
    "ActiveState=inactive",
)


def test_the_look_at_the_fetch_unit() -> None:
    assert fetch_look_command("/srv/models/GLM 5") == (
        "cat '/srv/models/GLM 5/.pvegpu/status.json' 2>/dev/null | tr -d '\\n'; echo; "
        "systemctl show --property ActiveState --property Result pvegpu-model-fetch.service"
    )
    look = parse_fetch_look(LOOK)
    assert (look.active, look.result) == ("inactive", "success")
    assert look.status == FetchStatus(
        "verified",
        24320865,
        24320865,
        "festr2/GLM-5-NVFP4-MTP@22421ef2307503bcaa146f585e3de67f4dc44d77: 4 files, 24.3 MB, verified",
        1796334153.0879157,
    )
    assert parse_fetch_look(("", "ActiveState=activating")) == FetchLook(None, "activating", "")
    assert parse_fetch_look(('{"state": "runn', "ActiveState=activating", "Result=success")).status is None
    with pytest.raises(FactParseError, match="'Failed to get properties' is not a systemctl show KEY=value"):
        parse_fetch_look(("", "Failed to get properties"))


def test_the_start_and_journal_commands() -> None:
    assert fetch_start_command("/m") == (
        "rm -f /m/.pvegpu/status.json; systemctl reset-failed pvegpu-model-fetch.service 2>/dev/null; "
        "systemctl start --no-block pvegpu-model-fetch.service"
    )
    assert fetch_journal_command(20) == (
        "journalctl --unit pvegpu-model-fetch.service --lines 20 --output cat --no-pager"
    )
