"""What an operator declares about the model's one store on the node: host data key `model` (ModelSpec).

    ("pve1", {"node": {...}, "model": {"source": {"repo": "festr2/GLM-5-NVFP4-MTP", "revision": "<commit>"}}})

The node holds the weights once, whichever profile serves them: the VM reads them through virtiofs (the
directory mapping `SHARE_ID`), the container through a read-only bind mount, bare metal at the store's path;
switching profiles never downloads them again. `source` is a Hugging Face repository (fetched into `store` on
the node by `pvegpu-model-fetch.service`, verified file by file) or a directory already on the node (an NFS
mount, a copy: served as it is, nothing fetched).
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator

from pvegpu.models.fields import AbsolutePath, matching

MODEL_KEY = "model"
STORE_ROOT = "/var/lib/pvegpu/models"
# The directory mapping's id (/cluster/mapping/dir) and so the virtiofs tag the guest mounts.
SHARE_ID = "pvegpu-models"

_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_REVISION = re.compile(r"[A-Za-z0-9]+([._/-][A-Za-z0-9]+)*")  # git's ref rules: no `..`, no `//`, no end `.`
_ENDPOINT = re.compile(r"https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~/-]*)?")


class HubSource(BaseModel):
    """A Hugging Face repository, fetched into the store on the node and verified there."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    repo: Annotated[str, matching(_REPO, "a Hugging Face repository like <owner>/<name>")] = Field(
        description="Hugging Face repository (e.g. `festr2/GLM-5-NVFP4-MTP`)."
    )
    revision: Annotated[str, matching(_REVISION, "a commit, tag or branch")] | None = Field(
        default=None,
        description=(
            "A commit, tag or branch; None: `main` as it is at the first fetch, recorded with its commit and "
            "kept (a later run does not follow the branch)."
        ),
    )
    endpoint: Annotated[str, matching(_ENDPOINT, "an http(s) URL")] | None = Field(
        default=None, description="The hub's address (a mirror); None: https://huggingface.co."
    )
    token_file: AbsolutePath | None = Field(
        default=None,
        description="Root's 0600 file on the node with the token of a gated repository; never printed.",
    )


class DirSource(BaseModel):
    """A directory already on the node that holds the model (an NFS mount, a copy): served as it is."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    dir: AbsolutePath = Field(description="The model's directory on the node (its config.json in it).")


def _source_kind(value: Any) -> str | None:
    if isinstance(value, HubSource | DirSource):
        return "repo" if isinstance(value, HubSource) else "dir"
    if isinstance(value, dict):
        return "repo" if "repo" in value else "dir" if "dir" in value else None
    return None


Source = Annotated[
    Annotated[HubSource, Tag("repo")] | Annotated[DirSource, Tag("dir")],
    Discriminator(
        _source_kind,
        custom_error_type="model_source",
        custom_error_message=(
            "must be a mapping with `repo` (a Hugging Face repository, fetched) or `dir` (a directory on "
            "the node)"
        ),
    ),
]


class ModelSpec(BaseModel):
    """The model's one store on the node: host data key `model` (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    source: Source = Field(
        description=(
            "`{repo, revision, endpoint, token_file}`: fetched into `store` on the node, resumed after a "
            "cut, every file checked against the hub's size and sha256, free space checked first; or "
            "`{dir}`: a directory on the node already holding it, served as it is."
        )
    )
    store: AbsolutePath | None = Field(
        default=None,
        description=(
            f"Where the node keeps a fetched model; None: `{STORE_ROOT}/<the repository's name>`. Not with "
            "a `dir` source (that directory is the store)."
        ),
    )
    pip_args: tuple[str, ...] = Field(
        default=(),
        description="Extra `pip install` arguments for huggingface_hub in the node's hub venv (a mirror).",
    )

    @field_validator("store")
    @classmethod
    def _store_of_dir(cls, store: str | None, info: ValidationInfo) -> str | None:
        if store is not None and isinstance(info.data.get("source"), DirSource):
            raise ValueError("not with a `dir` source, whose directory is the store")
        return store

    @property
    def path(self) -> str:
        """The model's directory on the node."""
        if isinstance(self.source, DirSource):
            return posixpath.normpath(self.source.dir)
        if self.store is not None:
            return posixpath.normpath(self.store)
        return f"{STORE_ROOT}/{self.source.repo.split('/')[1]}"
