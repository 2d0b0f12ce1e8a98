"""The model's files on the host that holds them, and what pvegpu's fetcher (pvegpu/fetch/main.py) keeps
beside them: its verified record and its status, under `<model_path>/.pvegpu/`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# huggingface_hub in pvegpu's hub venv; SGLang 0.5.23's transformers 5.19.0 asks for >=1.31.0,<3.0, so the
# same version serves both where they meet.
HF_HUB_VERSION = "1.33.0"
HUB_VENV = "/opt/pvegpu/hub"
FETCH_UNIT = "pvegpu-model-fetch.service"
FETCH_UNIT_FILE = f"/etc/systemd/system/{FETCH_UNIT}"
FETCH_SCRIPT = "/usr/local/lib/pvegpu/model-fetch.py"
FETCH_CONFIG = "/etc/pvegpu/model-fetch.json"
RECORD = ".pvegpu/model.json"
STATUS = ".pvegpu/status.json"


@dataclass(frozen=True)
class FetchTarget:
    """What `pvegpu-model-fetch.service` fetches and where: `repo`@`revision` from `endpoint` (None: the
    hub's default) into `path`, as `user`, with the token in `token_file` (None: none); `pip_args` for the
    hub venv. A serving host's own (`sglang.model_repo`) or the node's store (`model`)."""

    repo: str
    revision: str | None
    endpoint: str | None
    token_file: str | None
    path: str
    user: str
    pip_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoreFile:
    """A file of the model directory as the host shows it (or as the record has it, checked)."""

    size: int
    mtime_ns: int


@dataclass(frozen=True)
class ModelRecord:
    """The fetcher's record: the commit of `repo`@`revision` and each verified file's size and mtime."""

    repo: str
    revision: str | None
    commit: str | None
    complete: bool
    files: Mapping[str, StoreFile] = field(default_factory=dict)


@dataclass(frozen=True)
class FetchStatus:
    """The fetcher's `status.json`: `state` running|verified|failed, bytes `done` of `total`, `message`;
    while running, `phase` listing|checking (the files on disk hashed) |downloading."""

    state: str
    done: int
    total: int
    message: str | None
    time: float
    phase: str | None = None


def record_path(model_path: str) -> str:
    return f"{model_path}/{RECORD}"


def status_path(model_path: str) -> str:
    return f"{model_path}/{STATUS}"
