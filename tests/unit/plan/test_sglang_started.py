"""pvegpu/plan/sglang_started.py: the start record's command run here by sh as systemd hands it over, its
parser, and when the record asks for a restart."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path

import pytest

from pvegpu.plan import sglang_started
from pvegpu.plan.sglang_started import record_start, restart_reason, started_digests

UNIT, ENV = "/etc/systemd/system/sglang.service", "/etc/pvegpu/sglang.env"
A, B = "a" * 64, "b" * 64


def _systemd_argv(value: str) -> list[str]:
    """The argv systemd runs for an `ExecStartPre=` value without its `-+` prefix, for the words
    `systemd_word` makes (plain, or double-quoted with `\\\\`, `\\"` and doubled `$`/`%`)."""
    assert value.startswith("-+")
    return [word.replace("$$", "$").replace("%%", "%") for word in shlex.split(value[2:])]


def test_the_record_holds_each_files_digest_and_the_parser_reads_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as systemd would (the doubled backslash of a mount unit's name unquoted to one): one NUL-ended
    `<digest>  <path>` per file, the backslash kept; a missing file is left out."""
    record = tmp_path / "started"
    monkeypatch.setattr(sglang_started, "_SCRIPT", f'sha256sum -z -- "$@" > {record}')
    unit, mount = tmp_path / "sglang.service", tmp_path / "srv-models-GLM\\x2d5.mount"
    unit.write_text("[Service]\n")
    mount.write_text("[Mount]\n")
    argv = _systemd_argv(record_start((str(unit), str(mount), str(tmp_path / "missing"))))
    assert argv[:2] == ["/bin/sh", "-c"]
    subprocess.run(argv, check=False, capture_output=True)
    assert started_digests(record.read_text()) == {
        str(unit): hashlib.sha256(b"[Service]\n").hexdigest(),
        str(mount): hashlib.sha256(b"[Mount]\n").hexdigest(),
    }


def test_the_unit_line_names_the_record_and_each_file() -> None:
    assert record_start((UNIT, ENV)) == (
        '-+/bin/sh -c "sha256sum -z -- \\"$$@\\" > /run/pvegpu-sglang.started" sh '
        "/etc/systemd/system/sglang.service /etc/pvegpu/sglang.env"
    )


def test_a_cut_entry_is_left_out() -> None:
    assert started_digests(f"{A}  {UNIT}\0{B[:30]}") == {UNIT: A}
    assert started_digests("") == {}


@pytest.mark.parametrize(
    ("record", "on_disk", "running"),
    [
        (f"{A}  {UNIT}\0{B}  {ENV}\0", {UNIT: A, ENV: B}, True),  # the files it started from
        (f"{A}  {UNIT}\0", {UNIT: B}, False),  # not running: its start comes from the run's own operations
        (None, {UNIT: B}, True),  # no record (started by an older unit): nothing to compare
    ],
)
def test_no_restart(record: str | None, on_disk: dict[str, str | None], running: bool) -> None:
    assert restart_reason(record, on_disk, running=running) is None


def test_a_file_that_is_not_the_one_it_started_from_restarts_it() -> None:
    assert restart_reason(f"{A}  {UNIT}\0{A}  {ENV}\0", {UNIT: A, ENV: B}, running=True) == (
        "sglang.service runs with another /etc/pvegpu/sglang.env than the one on disk (a run stopped before "
        "restarting it): restarting it"
    )


def test_a_file_it_did_not_start_from_or_one_gone_restarts_it() -> None:
    topo = "/etc/pvegpu/nccl-topo.xml"
    assert restart_reason(f"{A}  {UNIT}\0", {UNIT: A, topo: B}, running=True) == (
        f"sglang.service runs with another {topo} than the one on disk (a run stopped before restarting it): "
        "restarting it"
    )
    assert restart_reason(f"{A}  {UNIT}\0{B}  {topo}\0", {UNIT: A, topo: None}, running=True) is not None
