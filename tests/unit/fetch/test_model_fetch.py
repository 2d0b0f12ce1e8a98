"""pvegpu's model fetcher (pvegpu/fetch/main.py) with the real huggingface_hub client against the lab's hub
stand-in (lab/standins/hf_hub.py) on loopback: verified, resumed, corrupted files found, space refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from lab.standins import hf_hub
from pvegpu.fetch import main as fetch
from pvegpu.models import model_store
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.model_fetch import fetch_config, serving_fetch_target
from pvegpu.plan.model_fetch import size_text as plan_size_text

REPO = "zai-org/GLM-5-NVFP4"
COMMIT = "3" * 40
TOKEN = "hf_labtoken"
SHARD = bytes(range(256)) * 1200  # 307,200 bytes


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "hub"
    files = root / REPO / COMMIT
    files.mkdir(parents=True)
    (root / REPO / "refs.json").write_text(json.dumps({"main": COMMIT}))
    (files / "config.json").write_text('{"architectures": ["GlmMoeDsaForCausalLM"]}\n')
    (files / "sub").mkdir()
    (files / "sub/tokenizer.json").write_text("{}\n")
    (files / "model-00001-of-00001.safetensors").write_bytes(SHARD)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    hf_hub.Hub.root, hf_hub.Hub.token, hf_hub.Hub.rate = root, TOKEN, 0
    hf_hub.Hub.log_path = tmp_path / "hub.log"
    server = ThreadingHTTPServer(("127.0.0.1", 0), hf_hub.Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(token))
    monkeypatch.setenv("HF_TOKEN_PATH", str(token))
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    finally:
        server.shutdown()


def run(endpoint: str, store: Path, revision: str | None = None) -> tuple[int, list[str]]:
    """The fetcher on the config a run writes for it (`plan.model_fetch.fetch_config` of the spec)."""
    config = store.parent / "fetch.json"
    spec = SglangSpec(model_path=str(store), model_repo=REPO, model_revision=revision, hf_endpoint=endpoint)
    target = serving_fetch_target(spec)
    assert target is not None
    config.write_text(fetch_config(target))
    printed: list[str] = []
    return fetch.main(["main.py", str(config)], printed.append), printed


def requests(log: Path) -> list[dict[str, Any]]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


def test_fetches_every_file_verified_then_a_second_run_downloads_nothing(hub: tuple[str, Path]) -> None:
    endpoint, tmp = hub
    store = tmp / "store"
    assert run(endpoint, store) == (0, [f"{REPO}@{COMMIT}: 3 files, 307 kB, verified"])
    assert (store / "model-00001-of-00001.safetensors").read_bytes() == SHARD
    assert (store / "sub/tokenizer.json").read_text() == "{}\n"
    record = json.loads((store / ".pvegpu/model.json").read_text())
    assert (record["repo"], record["revision"], record["commit"], record["complete"]) == (
        REPO,
        None,
        COMMIT,
        True,
    )
    assert record["files"]["model-00001-of-00001.safetensors"]["sha256"] == hashlib.sha256(SHARD).hexdigest()
    status = json.loads((store / ".pvegpu/status.json").read_text())
    assert (status["state"], status["done"], status["total"]) == ("verified", 307247, 307247)
    assert not (store / ".pvegpu/partial").exists()
    requests(tmp / "hub.log")
    assert run(endpoint, store)[0] == 0
    # The record pins the commit: no revision lookup, only the tree listing; no file is fetched.
    assert [(r["method"], r["path"].split("?")[0]) for r in requests(tmp / "hub.log")] == [
        ("GET", f"/api/models/{REPO}/tree/{COMMIT}")
    ]


def test_a_cut_download_resumes_from_its_partial_bytes(hub: tuple[str, Path]) -> None:
    endpoint, tmp = hub
    store = tmp / "store"
    part = store / ".pvegpu/partial/model-00001-of-00001.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(SHARD[:100_000])
    assert run(endpoint, store)[0] == 0
    gets = [r for r in requests(tmp / "hub.log") if r["method"] == "GET" and "/resolve/" in r["path"]]
    shard = [r for r in gets if r["path"].endswith(".safetensors")]
    assert [(r["range"], r["status"]) for r in shard] == [("bytes=100000-", 206)]
    assert (store / "model-00001-of-00001.safetensors").read_bytes() == SHARD


def test_a_file_changed_on_disk_is_found_and_fetched_again(hub: tuple[str, Path]) -> None:
    endpoint, tmp = hub
    store = tmp / "store"
    assert run(endpoint, store)[0] == 0
    shard = store / "model-00001-of-00001.safetensors"
    shard.write_bytes(b"\xff" + SHARD[1:])  # same size, other content, new mtime
    requests(tmp / "hub.log")
    assert run(endpoint, store)[0] == 0
    assert shard.read_bytes() == SHARD
    fetched = [
        r["path"] for r in requests(tmp / "hub.log") if r["method"] == "GET" and "/resolve/" in r["path"]
    ]
    assert fetched == [f"/{REPO}/resolve/{COMMIT}/model-00001-of-00001.safetensors"]


def test_too_little_space_is_refused_before_any_byte(
    hub: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, tmp = hub
    store = tmp / "store"
    # A fake only of the free space: the real statvfs of a test machine cannot be made small.
    usage = shutil.disk_usage(tmp)._replace(free=300_000)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage)
    code, printed = run(endpoint, store)
    assert (code, printed) == (2, [f"model: needs 307 kB on {store}, 300 kB free"])
    assert not [r for r in requests(tmp / "hub.log") if "/resolve/" in r["path"] and r["method"] == "GET"]
    status = json.loads((store / ".pvegpu/status.json").read_text())
    assert (status["state"], status["message"]) == ("failed", f"model: needs 307 kB on {store}, 300 kB free")


def test_without_the_token_the_gated_repository_refuses(
    hub: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, tmp = hub
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp / "absent"))
    with pytest.raises(Exception, match="401"):
        run(endpoint, tmp / "store")


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1 kB"), (1_050_000, "1.05 MB"), (429e9, "429 GB"),
     (312.4e9, "312 GB"), (99.96e9, "100 GB"), (2.5e15, "2500 TB")],
)  # fmt: skip
def test_size_text_is_the_same_on_the_host_and_in_the_run(count: float, text: str) -> None:
    # The fetcher is uploaded alone, so the run's progress lines have their own copy.
    assert fetch.size_text(count) == plan_size_text(count) == text


def test_the_run_reads_the_files_the_fetcher_writes() -> None:
    assert (fetch.RECORD, fetch.STATUS) == (model_store.RECORD, model_store.STATUS)
