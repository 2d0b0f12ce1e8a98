"""The model directory's file list (GNU find's output, read here) and the fetcher's record and status."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.model_store import (
    ModelStoreRead,
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
