"""The model fetch operation: a noop from the state read when the model is as verified; otherwise the hub
venv's exact command, then the wait (which starts or attaches to the unit)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from pyinfra.api.command import FunctionCommand

from pvegpu.facts.host_read import HostState
from pvegpu.fetch import main as fetcher
from pvegpu.models.model_store import StoreFile
from pvegpu.models.sglang import SglangSpec
from pvegpu.operations.model_fetch import fetcher_source, model_fetch
from tests.unit.host_states import decide_from, host_state
from tests.unit.op_harness import run_op

SPEC = SglangSpec(
    model_path="/models/GLM-5-NVFP4",
    model_repo="nvidia/GLM-5-NVFP4",
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


def state(record: dict[str, object] | None, store: dict[str, StoreFile] | None) -> HostState:
    text = None if record is None else json.dumps(record)
    return replace(host_state(), records={"/models/GLM-5-NVFP4/.pvegpu/model.json": text}, store=store)


def test_noop_when_every_verified_file_is_as_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, state(RECORD, {"config.json": StoreFile(10, 5)}))
    assert run_op(model_fetch, {}, spec=SPEC) == (
        [],
        [f"/models/GLM-5-NVFP4: nvidia/GLM-5-NVFP4@{COMMIT}: 1 files, 10 B, verified"],
    )


@pytest.mark.parametrize(
    ("record", "store"),
    [(None, None), (RECORD, {"config.json": StoreFile(10, 6)}), ({**RECORD, "complete": False}, {})],
)
def test_otherwise_the_hub_venv_then_the_wait(
    monkeypatch: pytest.MonkeyPatch, record: dict[str, object] | None, store: dict[str, StoreFile] | None
) -> None:
    decide_from(monkeypatch, state(record, store))
    commands, noops = run_op(model_fetch, {}, spec=SPEC)
    assert (commands[0], noops) == (HUB_VENV, [])
    assert isinstance(commands[1], FunctionCommand)
    assert len(commands) == 2


def test_the_host_gets_the_fetcher_file_unchanged() -> None:
    assert fetcher_source() == Path(fetcher.__file__).read_text()
