"""ModelSpec (`model`): the store's path for each source, and the exact `host: path: message` lines of what
is refused."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pvegpu.inventory.validate import validate_inventory
from pvegpu.models.errors import InventoryError
from pvegpu.models.model import DirSource, HubSource, ModelSpec

NODE = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}


def refused(model: Mapping[str, object]) -> list[str]:
    with pytest.raises(InventoryError) as raised:
        validate_inventory([("h", {"node": NODE, "model": model})])
    return list(raised.value.problems)


def test_a_repository_is_stored_under_var_lib_by_its_name() -> None:
    spec = ModelSpec.model_validate({"source": {"repo": "festr2/GLM-5-NVFP4-MTP", "revision": "a1b2c3"}})
    assert spec.source == HubSource(repo="festr2/GLM-5-NVFP4-MTP", revision="a1b2c3")
    assert spec.path == "/var/lib/pvegpu/models/GLM-5-NVFP4-MTP"


def test_a_store_and_a_directory_source_are_the_path_as_written_normalised() -> None:
    stored = ModelSpec.model_validate({"source": {"repo": "a/b"}, "store": "/tank/models/b/"})
    on_node = ModelSpec.model_validate({"source": {"dir": "/mnt/nfs/glm5/"}})
    assert (stored.path, on_node.path) == ("/tank/models/b", "/mnt/nfs/glm5")
    assert on_node.source == DirSource(dir="/mnt/nfs/glm5/")


@pytest.mark.parametrize(
    ("model", "line"),
    [
        (
            {"source": {"dir": "/tank/glm5"}, "store": "/var/lib/x"},
            "h: model.store: not with a `dir` source, whose directory is the store",
        ),
        (
            {"source": {"url": "https://example.net/glm5"}},
            "h: model.source: must be a mapping with `repo` (a Hugging Face repository, fetched) or `dir` "
            "(a directory on the node) (got {'url': 'https://example.net/glm5'})",
        ),
        (
            {"source": {"repo": "GLM-5"}},
            "h: model.source.repo: 'GLM-5' is not a Hugging Face repository like <owner>/<name>",
        ),
        (
            {"source": {"repo": "a/b", "revision": "main..x"}},
            "h: model.source.revision: 'main..x' is not a commit, tag or branch",
        ),
        (
            {"source": {"repo": "a/b", "token_file": "hf-token"}},
            "h: model.source.token_file: must be an absolute path (got 'hf-token')",
        ),
        ({"source": {"dir": "/x", "repo_": "a/b"}}, "h: model.source.repo_: unknown field"),
    ],
)
def test_refused_with_the_field_named(model: Mapping[str, object], line: str) -> None:
    assert refused(model) == [line]
