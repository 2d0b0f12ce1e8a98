"""`model_share_mapping`: directory.cfg (from the node's state read) or the API in -> exact API calls out, the
noop sentence, or the refusal. directory.cfg is written as pve-guest-common Mapping/Dir.pm writes it (bare id
header, `map` lines, then `description`), synthesized; API answers and texts as the lab stand-in gives them
(lab/pve/pvelib/api/cluster_mapping.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.node_read import NodeRead
from pvegpu.models.dir_mapping import DIRECTORY_CFG
from pvegpu.operations.mapping_dir import dir_cfg_mapping, model_share_mapping
from pvegpu.plan.model_share import ModelShare
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import FakeApi, execute
from tests.unit.op_harness import node_state, run_op

STORE = "/srv/models/GLM-5-NVFP4"
MINE = f"node=pve1,path={STORE}"
PVE2 = "node=pve2,path=/tank/models"
MARK = "pvegpu model store pvegpu-owner: lab"
ONE = ("GET", "/cluster/mapping/dir/pvegpu-models")


class DirStore:
    """directory.cfg behind the dir mapping endpoints: a digest over the whole file, a PUT with another one
    refused with Proxmox's text, a GET of a missing id `mapping '<id>' not found`."""

    def __init__(self, entries: list[str] | None, description: str | None = MARK) -> None:
        self.entries, self.description, self.digest = entries, description, "d1"

    def answers(self) -> dict[tuple[str, str], object]:
        return {ONE: self._get, ("POST", "/cluster/mapping/dir"): self._post, ("PUT", ONE[1]): self._put}

    def _get(self, _params: dict[str, Any]) -> dict[str, Any]:
        if self.entries is None:
            raise PveError(500, "mapping 'pvegpu-models' not found")
        found: dict[str, Any] = {"type": "dir", "digest": self.digest, "map": self.entries}
        return found | ({} if self.description is None else {"description": self.description})

    def _post(self, params: dict[str, Any]) -> None:
        self.entries, self.description, self.digest = list(params["map"]), params.get("description"), "d2"

    def _put(self, params: dict[str, Any]) -> None:
        if params["digest"] != self.digest:
            raise PveError(500, "update directory mapping failed: detected modified configuration")
        self.entries, self.description, self.digest = list(params["map"]), params.get("description"), "d2"


def cfg(*entries: str, description: str | None = MARK) -> bytes:
    lines = ["pvegpu-models", *(f"\tmap {entry}" for entry in entries)]
    lines += [] if description is None else [f"\tdescription {description}"]
    return ("\n".join(["other", "\tmap node=pve1,path=/srv/other", "", *lines]) + "\n\n").encode()


def sync(api: FakeApi, raw: bytes | str | None = "unread") -> tuple[list[Any], list[str]]:
    files = {} if raw == "unread" else {DIRECTORY_CFG: raw}
    facts = {NodeRead: node_state(pve_files=files)}
    return run_op(
        model_share_mapping, facts, api=api.client, share=ModelShare(STORE), node="pve1", owner="lab"
    )


def test_create_absent_mapping_posts_it_from_the_state_read_without_a_get() -> None:
    store = DirStore(None)
    api = FakeApi(store.answers())
    commands, noops = sync(api, None)  # the node's read: no directory.cfg
    assert (api.calls, noops) == ([], [])
    execute(commands)
    assert api.calls == [
        ("POST", "/cluster/mapping/dir", {"id": "pvegpu-models", "map": [MINE], "description": MARK}),
        (*ONE, {}),  # read back
    ]


def test_update_keeps_another_nodes_line_and_sends_the_files_digest() -> None:
    raw = cfg(PVE2)
    store = DirStore([PVE2])
    store.digest = hashlib.sha1(raw).hexdigest()  # Proxmox's digest: the sha1 of directory.cfg
    api = FakeApi(store.answers())
    commands, _ = sync(api, raw)
    assert api.calls == []
    execute(commands)
    assert api.calls == [
        ("PUT", ONE[1], {"map": [PVE2, MINE], "description": MARK, "digest": hashlib.sha1(raw).hexdigest()}),
        (*ONE, {}),
    ]
    assert store.entries == [PVE2, MINE]


def test_update_through_the_api_when_the_state_read_does_not_hold() -> None:
    store = DirStore([PVE2], "pvegpu-owner: other")
    api = FakeApi(store.answers())
    commands, _ = sync(api)  # directory.cfg not in the read: asked
    execute(commands)
    assert api.calls == [
        (*ONE, {}),
        ("PUT", ONE[1], {"map": [PVE2, MINE], "description": "pvegpu-owner: other", "digest": "d1"}),
        (*ONE, {}),
    ]
    assert store.entries == [PVE2, MINE]


def test_noop_mapping_right_sends_nothing() -> None:
    api = FakeApi(DirStore([PVE2, MINE]).answers())
    commands, noops = sync(api, cfg(PVE2, MINE))
    assert (commands, api.calls) == ([], [])
    assert noops == [f"directory mapping pvegpu-models maps pve1 to {STORE}"]


def test_error_mapping_without_pvegpus_mark_is_refused_and_nothing_written() -> None:
    api = FakeApi(DirStore([PVE2], "team share").answers())
    with pytest.raises(
        OperationError, match=r"^directory mapping pvegpu-models is not pvegpu's \(description "
    ):
        sync(api, cfg(PVE2, description="team share"))
    assert api.writes() == []


def test_dir_cfg_mapping_reads_the_section_and_its_digest_or_says_it_is_not_modelled() -> None:
    raw = cfg(PVE2, MINE)
    modelled, state = dir_cfg_mapping(raw, "pvegpu-models")
    assert modelled
    assert state is not None
    assert (state.mapping.map, state.mapping.description) == ((PVE2, MINE), MARK)
    assert state.digest == hashlib.sha1(raw).hexdigest()
    assert dir_cfg_mapping(b"other\n\tmap node=pve1,path=/x\n", "pvegpu-models") == (True, None)
    assert dir_cfg_mapping(b"pvegpu-models\n\tmap a\n\tcomment x\n", "pvegpu-models") == (False, None)
