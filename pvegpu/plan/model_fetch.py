"""Whether a fetch target's directory (a serving host's `sglang.model_path`, or the node's store, `model`)
holds the verified `repo`@`revision`, and what the fetch unit is given and shows: its config, its ExecStart,
the run's progress lines.

Complete (no fetch): the fetcher's record is of this repository and revision, says complete, and every file
it verified is there with the size and mtime it had when checked (the host's state read lists them). Any
other state starts the fetch (or attaches to the one running), which checks again and fetches what is
missing or changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from pvegpu.models.doctor import Finding
from pvegpu.models.model import HubSource, ModelSpec
from pvegpu.models.model_store import (
    FETCH_CONFIG,
    FETCH_SCRIPT,
    HUB_VENV,
    FetchStatus,
    FetchTarget,
    ModelRecord,
    StoreFile,
)
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.sglang_service import systemd_word

FETCH_WORKERS = 8  # files at a time, as huggingface_hub's snapshot_download
NODE_FETCH_USER = "root"  # the node's store: root's, readable by all (the guest's and container's SGLang)


def serving_fetch_target(spec: SglangSpec) -> FetchTarget | None:
    """The serving host's own fetch (`sglang.model_repo` into `model_path`); None without a repository."""
    if spec.model_repo is None:
        return None
    return FetchTarget(
        repo=spec.model_repo,
        revision=spec.model_revision,
        endpoint=spec.hf_endpoint,
        token_file=spec.hf_token_file,
        path=spec.model_path,
        user=spec.user,
        pip_args=spec.pip_args,
    )


def node_fetch_target(model: ModelSpec) -> FetchTarget | None:
    """The node's fetch into its store; None for a `dir` source (nothing is fetched)."""
    source = model.source
    if not isinstance(source, HubSource):
        return None
    return FetchTarget(
        repo=source.repo,
        revision=source.revision,
        endpoint=source.endpoint,
        token_file=source.token_file,
        path=model.path,
        user=NODE_FETCH_USER,
        pip_args=model.pip_args,
    )


def fetch_reason(
    target: FetchTarget, record: ModelRecord | None, files: Mapping[str, StoreFile] | None
) -> str | None:
    """Why the model must be fetched (or checked) again; None when it is complete as verified."""
    wanted = f"{target.repo}@{target.revision or 'main'}"
    if record is None:
        return f"{wanted}: not fetched yet (no record of a verified fetch)"
    if (record.repo, record.revision) != (target.repo, target.revision):
        return f"{wanted}: the record is of {record.repo}@{record.revision or 'main'}"
    if not record.complete or record.commit is None:
        return f"{wanted}: the last fetch did not finish"
    on_disk = files or {}
    for path, checked in sorted(record.files.items()):
        if path not in on_disk:
            return f"{wanted}: {path} is missing"
        if on_disk[path] != checked:
            return f"{wanted}: {path} changed since it was verified"
    return None


def model_findings(
    target: FetchTarget, record: ModelRecord | None, files: Mapping[str, StoreFile] | None
) -> tuple[Finding, ...]:
    """The model doctor's line (roles/model_doctor.py) from the fetcher's `record` and the directory's
    `files`: complete as verified (`complete_line`), else a warning with `fetch_reason` and what the next
    deploy/site.py does."""
    reason = fetch_reason(target, record, files)
    if reason is None and record is not None:
        return (Finding(f"model: {complete_line(target, record)}"),)
    return (Finding(f"model: {reason}; the next deploy/site.py fetches it", warning=True),)


def complete_line(target: FetchTarget, record: ModelRecord) -> str:
    size = sum(file.size for file in record.files.values())
    files = f"{len(record.files)} files, {size_text(size)}"
    return f"{target.path}: {target.repo}@{record.commit}: {files}, verified"


def fetch_config(target: FetchTarget) -> str:
    """The fetcher's config (pvegpu/fetch/main.py); no secret: the token is systemd's credential."""
    config = {
        "repo": target.repo,
        "revision": target.revision,
        "dir": target.path,
        "endpoint": target.endpoint,
        "workers": FETCH_WORKERS,
    }
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def fetch_exec_start(config_path: str) -> str:
    return " ".join(systemd_word(word) for word in (f"{HUB_VENV}/bin/python", FETCH_SCRIPT, config_path))


@dataclass(frozen=True)
class ModelFetch:
    """What `pvegpu-model-fetch.service` is written from: its target, the fetcher's config (`fetch_config`,
    written to `FETCH_CONFIG`) and the unit's ExecStart."""

    target: FetchTarget
    config: str
    exec_start: str


def fetch_plan(target: FetchTarget) -> ModelFetch:
    return ModelFetch(target, fetch_config(target), fetch_exec_start(FETCH_CONFIG))


def progress_line(status: FetchStatus, rate: float | None) -> str:
    """`model: 1.2 GB of 429 GB (0%), 95.1 MB/s, ETA 1:15:03` (rate: bytes a second since the last line);
    while the files on disk are hashed, `model: checking what is on disk: 120 GB of 429 GB (27%), ...`."""
    share = f" ({100 * status.done // status.total}%)" if status.total else ""
    checking = "checking what is on disk: " if status.phase == "checking" else ""
    line = f"model: {checking}{size_text(status.done)} of {size_text(status.total)}{share}"
    if rate is None or rate <= 0:
        return line
    left = max(0, status.total - status.done) / rate
    hours, rest = divmod(round(left), 3600)
    return f"{line}, {size_text(rate)}/s, ETA {hours}:{rest // 60:02d}:{rest % 60:02d}"


def size_text(count: float) -> str:
    """Decimal units, three significant digits (the fetcher's own, pvegpu/fetch/main.py `size_text`)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 999.5 or unit == "TB":
            break
        count /= 1000
    return f"{count:.0f} {unit}" if count >= 99.5 or unit == "B" else f"{count:.3g} {unit}"
