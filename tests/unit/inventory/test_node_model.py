"""The node's model store (`model`) in its serving hosts' data: `node_model_sglang`, `serving` (inventory/
baremetal.py, inventory/lxc.py) and `guests_of` (the VM guest): the repository, how the host sees the store,
and the refusal of `sglang` keys the node's `model` sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pvegpu.inventory import guests as guest_inventory
from pvegpu.inventory.guests import guests_of
from pvegpu.inventory.profiles import node_model_sglang, serving
from tests.unit.inventory.test_guests import made, node

HUB = {"repo": "festr2/GLM-5-NVFP4-MTP", "revision": "v1", "token_file": "/root/hf-token"}
MODEL = {"source": HUB}
SGLANG = {"model_path": "/srv/models/GLM-5-NVFP4-MTP", "served_model_name": "glm-5"}
FROM_NODE = {
    "model_repo": "festr2/GLM-5-NVFP4-MTP",
    "model_revision": "v1",
    "hf_endpoint": None,
    "hf_token_file": "/root/hf-token",
}
STORE = "/var/lib/pvegpu/models/GLM-5-NVFP4-MTP"


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("vm", {**SGLANG, **FROM_NODE, "model_share": "virtiofs"}),
        ("lxc", {**SGLANG, **FROM_NODE, "model_share": "bind", "model_path": STORE}),
        ("baremetal", {**SGLANG, **FROM_NODE, "model_share": "local", "model_path": STORE}),
    ],
)
def test_each_profile_sees_the_nodes_store(profile: str, expected: dict[str, Any]) -> None:
    assert node_model_sglang(SGLANG, MODEL, profile) == (expected, [])


def test_a_directory_source_names_no_repository_and_is_its_own_store() -> None:
    data, problems = node_model_sglang(SGLANG, {"source": {"dir": "/mnt/nfs/glm5/"}}, "baremetal")
    assert (data, problems) == ({**SGLANG, "model_share": "local", "model_path": "/mnt/nfs/glm5"}, [])


def test_without_a_valid_model_the_data_is_as_given() -> None:
    assert node_model_sglang(SGLANG, None, "vm") == (SGLANG, [])
    assert node_model_sglang(SGLANG, {"source": {"repo": "no"}}, "vm") == (SGLANG, [])  # the node's problem


def test_keys_the_node_sets_are_refused_naming_each() -> None:
    _, problems = node_model_sglang({**SGLANG, "model_repo": "a/b", "hf_token_file": "/t"}, MODEL, "vm")
    assert problems == [
        "sglang.model_repo: set by the node's `model` (declare the model once, on the node)",
        "sglang.hf_token_file: set by the node's `model` (declare the model once, on the node)",
    ]


def test_serving_gives_bare_metal_the_store_and_keeps_the_nodes_model() -> None:
    node_data = {"node": {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}, "model": MODEL}
    data = serving(node_data, {"sglang": SGLANG}, "baremetal")
    assert data["sglang"] == {**SGLANG, **FROM_NODE, "model_share": "local", "model_path": STORE}
    assert data["model"] == MODEL
    assert "model" not in serving(node_data, {"sglang": SGLANG}, "lxc")  # the container's data


def test_serving_exits_2_naming_a_key_the_node_sets(capsys: pytest.CaptureFixture[str]) -> None:
    node_data = {"node": {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}, "model": MODEL}
    with pytest.raises(SystemExit) as exited:
        serving(node_data, {"sglang": {**SGLANG, "model_revision": "v2"}}, "baremetal")
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "pve1: sglang.model_revision: set by the node's `model` (declare the model once, on the node)\n"
    )


def test_the_vm_guest_mounts_the_nodes_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guest_inventory, "_answers", lambda _address: True)
    made(tmp_path, address="10.0.0.5")
    name, data = node(tmp_path, ipconfig="ip=10.0.0.5/24,gw=10.0.0.1")
    [(_, guest)] = guests_of([(name, {**data, "model": MODEL})], {"sglang": SGLANG})
    assert guest["sglang"] == {**SGLANG, **FROM_NODE, "model_share": "virtiofs"}


def test_the_vm_guests_data_must_not_set_the_nodes_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(guest_inventory, "_answers", lambda _address: True)
    made(tmp_path, address="10.0.0.5")
    name, data = node(tmp_path, ipconfig="ip=10.0.0.5/24,gw=10.0.0.1")
    with pytest.raises(SystemExit):
        guests_of([(name, {**data, "model": MODEL})], {"sglang": {**SGLANG, "model_repo": "a/b"}})
    assert capsys.readouterr().err == (
        "pve1.example.net: guests_of: sglang.model_repo: set by the node's `model` (declare the model once, "
        "on the node)\n"
    )
