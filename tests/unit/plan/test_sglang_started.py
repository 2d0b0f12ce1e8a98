"""pvegpu/plan/sglang_started.py: the start record's command run here by sh as systemd hands it over, its
parser, and when the record asks for a restart."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path

import pytest

from pvegpu.plan import sglang_started
from pvegpu.plan.sglang_started import (
    STARTED_RECORD,
    record_start,
    restart_reason,
    started_digests,
    started_version,
)

UNIT, ENV = "/etc/systemd/system/sglang.service", "/etc/pvegpu/sglang.env"
A, B, C = "a" * 64, "b" * 64, "c" * 64
VENV = "/opt/sglang/venv"
METADATA = f"{VENV}/lib/python3.11/site-packages/sglang-0.5.23.dist-info/METADATA"


def _systemd_argv(value: str) -> list[str]:
    """The argv systemd runs for an `ExecStartPre=` value without its `-+` prefix, for the words
    `systemd_word` makes (plain, or double-quoted with `\\\\`, `\\"` and doubled `$`/`%`)."""
    assert value.startswith("-+")
    return [word.replace("$$", "$").replace("%%", "%") for word in shlex.split(value[2:])]


def test_the_record_holds_each_files_digest_and_the_parser_reads_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as systemd would (the doubled backslash of a mount unit's name unquoted to one): one NUL-ended
    `<digest>  <path>` per file, the backslash kept, and the venv's SGLang metadata (the venv's path with a
    space, quoted: only the dist-info part is a pattern); a missing file is left out."""
    record = tmp_path / "started"
    monkeypatch.setattr(
        sglang_started, "_SCRIPT", sglang_started._SCRIPT.replace(STARTED_RECORD, str(record))
    )
    unit, mount = tmp_path / "sglang.service", tmp_path / "srv-models-GLM\\x2d5.mount"
    unit.write_text("[Service]\n")
    mount.write_text("[Mount]\n")
    venv = tmp_path / "the venv"
    metadata = venv / "lib/python3.11/site-packages/sglang-0.5.23.dist-info/METADATA"
    metadata.parent.mkdir(parents=True)
    metadata.write_text("Name: sglang\nVersion: 0.5.23\n")
    (venv / "lib/python3.11/site-packages/sglang_router-0.2.dist-info").mkdir()
    argv = _systemd_argv(record_start((str(unit), str(mount), str(tmp_path / "missing")), str(venv)))
    assert argv[:2] == ["/bin/sh", "-c"]
    subprocess.run(argv, check=False, capture_output=True)
    assert started_digests(record.read_text()) == {
        str(unit): hashlib.sha256(b"[Service]\n").hexdigest(),
        str(mount): hashlib.sha256(b"[Mount]\n").hexdigest(),
        str(metadata): hashlib.sha256(b"Name: sglang\nVersion: 0.5.23\n").hexdigest(),
    }
    assert started_version(record.read_text(), str(venv)) == "0.5.23"


def test_the_unit_line_names_the_record_the_venv_and_each_file() -> None:
    assert record_start((UNIT, ENV), VENV) == (
        '-+/bin/sh -c "sha256sum -z -- \\"$$@\\" \\"$$0\\"/lib/python*/site-packages/sglang-*.dist-info/'
        'METADATA > /run/pvegpu-sglang.started" /opt/sglang/venv /etc/systemd/system/sglang.service '
        "/etc/pvegpu/sglang.env"
    )


def test_the_version_is_the_one_of_the_venvs_own_metadata() -> None:
    other = "/opt/other/lib/python3.11/site-packages/sglang-0.5.9.dist-info/METADATA"
    near = f"{VENV}2/lib/python3.11/site-packages/sglang-0.5.8.dist-info/METADATA"
    assert started_version(f"{A}  {other}\0{B}  {near}\0{C}  {UNIT}\0", VENV) is None
    assert started_version(f"{A}  {other}\0{B}  {METADATA}\0", VENV) == "0.5.23"
    assert started_version(f"{A}  {METADATA}\0", f"{VENV}/") == "0.5.23"


def test_a_cut_entry_is_left_out() -> None:
    assert started_digests(f"{A}  {UNIT}\0{B[:30]}") == {UNIT: A}
    assert started_digests("") == {}


def _running(record: str, on_disk: dict[str, str | None]) -> str | None:
    """restart_reason for a running service whose venv holds the SGLang it started with."""
    return restart_reason(record, on_disk, running=True, venv=VENV, venv_version="0.5.23")


@pytest.mark.parametrize(
    ("record", "on_disk", "running"),
    [
        (f"{A}  {UNIT}\0{B}  {ENV}\0", {UNIT: A, ENV: B}, True),  # the files it started from
        (f"{A}  {UNIT}\0", {UNIT: B}, False),  # not running: its start comes from the run's own operations
        (None, {UNIT: B}, True),  # no record (started by an older unit): nothing to compare
    ],
)
def test_no_restart(record: str | None, on_disk: dict[str, str | None], running: bool) -> None:
    assert restart_reason(record, on_disk, running=running, venv=VENV, venv_version="0.5.23") is None


def test_a_file_that_is_not_the_one_it_started_from_restarts_it() -> None:
    assert _running(f"{A}  {UNIT}\0{A}  {ENV}\0", {UNIT: A, ENV: B}) == (
        "sglang.service runs with another /etc/pvegpu/sglang.env than the one on disk (a run stopped before "
        "restarting it): restarting it"
    )


def test_a_file_it_did_not_start_from_or_one_gone_restarts_it() -> None:
    topo = "/etc/pvegpu/nccl-topo.xml"
    assert _running(f"{A}  {UNIT}\0", {UNIT: A, topo: B}) == (
        f"sglang.service runs with another {topo} than the one on disk (a run stopped before restarting it): "
        "restarting it"
    )
    assert _running(f"{A}  {UNIT}\0{B}  {topo}\0", {UNIT: A, topo: None}) is not None


def test_another_sglang_in_the_venv_than_the_one_it_started_with_restarts_it() -> None:
    record = f"{A}  {UNIT}\0{C}  {METADATA}\0"
    assert restart_reason(record, {UNIT: A}, running=True, venv=VENV, venv_version="0.5.24") == (
        "sglang.service runs SGLang 0.5.23 and /opt/sglang/venv holds 0.5.24 (a run stopped before "
        "restarting it): restarting it"
    )
    # The same version, a venv without sglang (the venv's own operation installs it), an older record without
    # the venv's entry, or a stopped service: nothing to restart.
    for version in ("0.5.23", "0.5.23.0", "0.5.023", None):
        assert restart_reason(record, {UNIT: A}, running=True, venv=VENV, venv_version=version) is None
    assert restart_reason(f"{A}  {UNIT}\0", {UNIT: A}, running=True, venv=VENV, venv_version="0.5.24") is None
    assert restart_reason(record, {UNIT: A}, running=False, venv=VENV, venv_version="0.5.24") is None
