"""When the model must be fetched again, what the fetch unit is given, and the run's progress lines."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pvegpu.models.doctor import Finding
from pvegpu.models.model import ModelSpec
from pvegpu.models.model_store import FetchStatus, FetchTarget, ModelRecord, StoreFile
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.model_fetch import (
    complete_line,
    fetch_config,
    fetch_exec_start,
    fetch_reason,
    model_findings,
    node_fetch_target,
    progress_line,
    serving_fetch_target,
)

SGLANG = SglangSpec(model_path="/models/GLM-5-NVFP4", model_repo="nvidia/GLM-5-NVFP4")
_SPEC = serving_fetch_target(SGLANG)
assert _SPEC is not None
SPEC: FetchTarget = _SPEC
COMMIT = "a" * 40
FILES = {"config.json": StoreFile(2048, 1_700_000_000_123_456_789), "model.safetensors": StoreFile(10**9, 7)}
RECORD = ModelRecord("nvidia/GLM-5-NVFP4", None, COMMIT, True, FILES)


def test_the_serving_hosts_own_target_and_the_nodes_store_target() -> None:
    assert (
        FetchTarget(
            repo="nvidia/GLM-5-NVFP4",
            revision=None,
            endpoint=None,
            token_file=None,
            path="/models/GLM-5-NVFP4",
            user="sglang",
        )
        == SPEC
    )
    assert serving_fetch_target(SglangSpec()) is None
    node = ModelSpec.model_validate(
        {
            "source": {"repo": "festr2/GLM-5-NVFP4-MTP", "revision": "v1", "token_file": "/root/hf-token"},
            "pip_args": ["--index-url", "https://mirror.example.net/simple"],
        }
    )
    assert node_fetch_target(node) == FetchTarget(
        repo="festr2/GLM-5-NVFP4-MTP",
        revision="v1",
        endpoint=None,
        token_file="/root/hf-token",
        path="/var/lib/pvegpu/models/GLM-5-NVFP4-MTP",
        user="root",
        pip_args=("--index-url", "https://mirror.example.net/simple"),
    )
    assert node_fetch_target(ModelSpec.model_validate({"source": {"dir": "/tank/glm5"}})) is None


def test_complete_when_the_record_matches_and_every_file_is_as_verified() -> None:
    assert fetch_reason(SPEC, RECORD, {**FILES, "README.md": StoreFile(5, 5)}) is None
    assert complete_line(SPEC, RECORD) == (
        f"/models/GLM-5-NVFP4: nvidia/GLM-5-NVFP4@{COMMIT}: 2 files, 1 GB, verified"
    )


@pytest.mark.parametrize(
    ("spec", "record", "files", "reason"),
    [
        (SPEC, None, None, "nvidia/GLM-5-NVFP4@main: not fetched yet (no record of a verified fetch)"),
        (replace(SPEC, revision="v2"), RECORD, FILES,
         "nvidia/GLM-5-NVFP4@v2: the record is of nvidia/GLM-5-NVFP4@main"),
        (SPEC, ModelRecord("nvidia/GLM-5-NVFP4", None, COMMIT, False, FILES), FILES,
         "nvidia/GLM-5-NVFP4@main: the last fetch did not finish"),
        (SPEC, RECORD, {"config.json": FILES["config.json"]},
         "nvidia/GLM-5-NVFP4@main: model.safetensors is missing"),
        (SPEC, RECORD, {**FILES, "model.safetensors": StoreFile(10**9, 8)},
         "nvidia/GLM-5-NVFP4@main: model.safetensors changed since it was verified"),
        (SPEC, RECORD, None, "nvidia/GLM-5-NVFP4@main: config.json is missing"),
    ],
)  # fmt: skip
def test_fetch_reason(
    spec: FetchTarget, record: ModelRecord | None, files: dict[str, StoreFile] | None, reason: str
) -> None:
    assert fetch_reason(spec, record, files) == reason


def test_the_doctor_says_complete_as_info_else_why_and_the_next_fetch_as_a_warning() -> None:
    assert model_findings(SPEC, RECORD, FILES) == (
        Finding(f"model: /models/GLM-5-NVFP4: nvidia/GLM-5-NVFP4@{COMMIT}: 2 files, 1 GB, verified"),
    )
    assert model_findings(SPEC, None, None) == (
        Finding(
            "model: nvidia/GLM-5-NVFP4@main: not fetched yet (no record of a verified fetch); the next "
            "deploy/site.py fetches it",
            warning=True,
        ),
    )
    assert model_findings(SPEC, RECORD, {"config.json": FILES["config.json"]}) == (
        Finding(
            "model: nvidia/GLM-5-NVFP4@main: model.safetensors is missing; "
            "the next deploy/site.py fetches it",
            warning=True,
        ),
    )


def test_the_config_holds_no_secret_and_the_unit_runs_the_hub_venv() -> None:
    spec = replace(SPEC, token_file="/root/hf-token", endpoint="http://127.0.0.1:8091")
    assert json.loads(fetch_config(spec)) == {
        "repo": "nvidia/GLM-5-NVFP4",
        "revision": None,
        "dir": "/models/GLM-5-NVFP4",
        "endpoint": "http://127.0.0.1:8091",
        "workers": 8,
    }
    assert "hf-token" not in fetch_config(spec)
    assert fetch_exec_start("/etc/pvegpu/model-fetch.json") == (
        "/opt/pvegpu/hub/bin/python /usr/local/lib/pvegpu/model-fetch.py /etc/pvegpu/model-fetch.json"
    )


def test_progress_lines() -> None:
    status = FetchStatus("running", 1_200_000_000, 429_000_000_000, None, 0.0)
    assert progress_line(status, None) == "model: 1.2 GB of 429 GB (0%)"
    assert progress_line(status, 95_100_000) == "model: 1.2 GB of 429 GB (0%), 95.1 MB/s, ETA 1:14:58"
    assert progress_line(FetchStatus("running", 0, 0, None, 0.0), None) == "model: 0 B of 0 B"
    checking = FetchStatus("running", 120 * 10**9, 429 * 10**9, None, 0.0, "checking")
    assert progress_line(checking, 2 * 10**9) == (
        "model: checking what is on disk: 120 GB of 429 GB (27%), 2 GB/s, ETA 0:02:34"
    )
