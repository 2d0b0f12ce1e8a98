"""The model fetch operation: a noop from the state read when the model is as verified; otherwise the hub
venv's exact command, then the wait (which starts or attaches to the unit)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.model_store import parse_model_record
from pvegpu.fetch import main as fetcher
from pvegpu.models.model_store import FetchTarget, ModelRecord, StoreFile
from pvegpu.operations import model_fetch as model_fetch_op
from pvegpu.operations.model_fetch import fetcher_source, model_fetch, wait_for_fetch
from tests.unit.op_harness import run_op

TARGET = FetchTarget(
    repo="nvidia/GLM-5-NVFP4",
    revision=None,
    endpoint=None,
    token_file=None,
    path="/models/GLM-5-NVFP4",
    user="sglang",
    pip_args=("--no-index", "--find-links", "/srv/wheels"),
)
COMMIT = "b" * 40
RECORD: dict[str, object] = {
    "repo": "nvidia/GLM-5-NVFP4",
    "revision": None,
    "commit": COMMIT,
    "complete": True,
    "files": {"config.json": {"size": 10, "mtime_ns": 5, "sha256": None, "blob_id": "x"}},
}
HUB_VENV = (
    "{ [ -x /opt/pvegpu/hub/bin/python ] || python3 -m venv /opt/pvegpu/hub ; } && "
    "{ /opt/pvegpu/hub/bin/python -c 'import importlib.metadata as m, sys; "
    "sys.exit(m.version('\"'\"'huggingface_hub'\"'\"') != '\"'\"'1.33.0'\"'\"')' 2>/dev/null || "
    "/opt/pvegpu/hub/bin/pip install --disable-pip-version-check --quiet --no-index --find-links /srv/wheels "
    "huggingface_hub==1.33.0 ; }"
)


def read(record: dict[str, object] | None) -> ModelRecord | None:
    return parse_model_record(None if record is None else json.dumps(record))


def test_noop_when_every_verified_file_is_as_recorded() -> None:
    files = {"config.json": StoreFile(10, 5)}
    assert run_op(model_fetch, {}, target=TARGET, record=read(RECORD), files=files) == (
        [],
        [f"/models/GLM-5-NVFP4: nvidia/GLM-5-NVFP4@{COMMIT}: 1 files, 10 B, verified"],
    )


@pytest.mark.parametrize(
    ("record", "store"),
    [(None, None), (RECORD, {"config.json": StoreFile(10, 6)}), ({**RECORD, "complete": False}, {})],
)
def test_otherwise_the_hub_venv_then_the_wait(
    record: dict[str, object] | None, store: dict[str, StoreFile] | None
) -> None:
    commands, noops = run_op(model_fetch, {}, target=TARGET, record=read(record), files=store)
    assert (commands[0], noops) == (HUB_VENV, [])
    assert isinstance(commands[1], FunctionCommand)
    assert len(commands) == 2


def test_the_host_gets_the_fetcher_file_unchanged() -> None:
    assert fetcher_source() == Path(fetcher.__file__).read_text()


LOOK = "cat /m/.pvegpu/status.json 2>/dev/null | tr -d '\\n'; echo; " + (
    "systemctl show --property ActiveState --property Result pvegpu-model-fetch.service"
)
START = (
    "rm -f /m/.pvegpu/status.json; systemctl reset-failed pvegpu-model-fetch.service 2>/dev/null; "
    "systemctl start --no-block pvegpu-model-fetch.service"
)
JOURNAL = "journalctl --unit pvegpu-model-fetch.service --lines 20 --output cat --no-pager"


def status(state: str, done: int = 0, total: int = 0, message: str | None = None) -> str:
    return json.dumps({"state": state, "done": done, "total": total, "message": message, "time": 1.0})


class Host:
    """The wait's view of the host: each command's stdout scripted, each command and log line kept."""

    print_prefix = "[h] "

    def __init__(self, answers: list[tuple[str, ...]]) -> None:
        self.answers, self.commands, self.lines = answers, list[str](), list[str]()

    def run_shell_command(self, command: str, **_: object) -> tuple[bool, SimpleNamespace]:
        self.commands.append(command)
        return True, SimpleNamespace(stdout_lines=list(self.answers.pop(0)))


OP = "pvegpu.operations.model_fetch"


def wait(monkeypatch: pytest.MonkeyPatch, answers: list[tuple[str, ...]]) -> Host:
    """`wait_for_fetch("/m")` with the clock moving 5 s at each poll; raises what it raises."""
    fake = Host(answers)
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(model_fetch_op, "host", fake)
    monkeypatch.setattr(f"{OP}.logger.info", fake.lines.append)
    monkeypatch.setattr(f"{OP}.time.monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(f"{OP}.time.sleep", lambda _: None)
    try:
        wait_for_fetch("/m")
    finally:
        monkeypatch.undo()
    return fake


def test_the_wait_starts_the_unit_prints_progress_at_most_every_10_s_and_ends_verified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inactive = ("", "Result=success", "ActiveState=inactive")
    running = "ActiveState=activating"
    host = wait(
        monkeypatch,
        [
            inactive,
            (),  # the start
            ("", running),  # the --no-block start's job has not run yet
            (status("running", 0, 4_000_000_000), running),
            (status("running", 1_000_000_000, 4_000_000_000), running),
            (status("running", 2_000_000_000, 4_000_000_000), running),
            (
                status("verified", 4_000_000_000, 4_000_000_000, "r@c: 2 files, 4.00 GB, verified"),
                "Result=success",
            ),
        ],
    )
    assert host.commands == [LOOK, START, LOOK, LOOK, LOOK, LOOK, LOOK]
    assert host.answers == []
    assert host.lines == [
        "[h] model: 0 B of 4 GB (0%)",
        "[h] model: 2 GB of 4 GB (50%), 200 MB/s, ETA 0:00:10",
        "[h] model: r@c: 2 files, 4.00 GB, verified",
    ]


def test_the_wait_attaches_to_a_running_fetch_and_fails_with_its_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refusal = "model: needs 429 GB on /m, 312 GB free"
    with pytest.raises(OperationError) as raised:
        wait(
            monkeypatch,
            [("", "ActiveState=activating"), (status("failed", message=refusal), "ActiveState=failed")],
        )
    assert str(raised.value) == refusal


def test_a_fetch_that_ends_otherwise_names_its_result_and_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [
        ("", "ActiveState=failed", "Result=exit-code"),
        (),  # the start
        (status("running", 5, 10), "ActiveState=failed", "Result=signal"),
        ("Killed", "x"),
    ]
    with pytest.raises(OperationError) as raised:
        wait(monkeypatch, answers)
    assert str(raised.value) == (
        "model: pvegpu-model-fetch.service ended signal (last status: running, 5 B of 10 B); the next run "
        "resumes from the bytes on disk; its last journal lines:\nKilled\nx"
    )
