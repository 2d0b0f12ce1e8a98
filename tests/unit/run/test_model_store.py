"""The node's model store as its read shows it (pvegpu/run/model_store.py `node_store_of`), and what a
serving host fetches itself (pvegpu/run/serving.py `own_fetch`): nothing while it sees its node's store, the
fallback fetch of a VM guest whose node has no virtiofs, with its one info line."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import cast

import pytest
from pyinfra.api.host import Host

from pvegpu.facts.model_store import parse_model_record
from pvegpu.models.model import ModelSpec
from pvegpu.models.model_store import FetchTarget, StoreFile
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.model_fetch import fetch_plan
from pvegpu.run import model_store, serving
from pvegpu.run.model_store import NodeStore, node_store_of
from tests.unit.op_harness import FakeHost

REPO = "festr2/GLM-5-NVFP4-MTP"
STORE = "/var/lib/pvegpu/models/GLM-5-NVFP4-MTP"
HUB = ModelSpec.model_validate({"source": {"repo": REPO}})
FILES = {"config.json": StoreFile(10, 5)}
RECORD = parse_model_record(
    json.dumps(
        {
            "repo": REPO,
            "revision": None,
            "commit": "c" * 40,
            "complete": True,
            "files": {"config.json": {"size": 10, "mtime_ns": 5, "sha256": None, "blob_id": "x"}},
        }
    )
)
TARGET = FetchTarget(REPO, None, None, None, STORE, "root")
HOST = cast(Host, FakeHost({}))  # what the functions read of it: its print prefix, `[pve1] `


def node(
    monkeypatch: pytest.MonkeyPatch,
    model: ModelSpec | None,
    *,
    profile: str = "lxc",
    qemu_server: tuple[int, int, int] | None = (9, 2, 6),
    read: object = None,
) -> None:
    specs = SimpleNamespace(model=model, node=SimpleNamespace(profile=profile))
    monkeypatch.setattr(model_store, "plan_of", lambda _host: SimpleNamespace(specs=specs))
    state = SimpleNamespace(model=read, cpu_kernel=SimpleNamespace(qemu_server=qemu_server))
    monkeypatch.setattr(model_store, "node_state_of", lambda _host: state)


def test_a_complete_store_and_one_to_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    node(monkeypatch, HUB, read=(RECORD, FILES))
    assert node_store_of(HOST) == NodeStore(STORE, fetch_plan(TARGET), RECORD, FILES, complete=True)
    changed = {"config.json": StoreFile(10, 6)}
    node(monkeypatch, HUB, read=(RECORD, changed))
    assert node_store_of(HOST) == NodeStore(STORE, fetch_plan(TARGET), RECORD, changed, complete=False)
    node(monkeypatch, HUB, read=(None, None))
    assert node_store_of(HOST) == NodeStore(STORE, fetch_plan(TARGET), None, None, complete=False)


def test_a_directory_is_served_as_it_is_and_no_model_no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    node(monkeypatch, ModelSpec.model_validate({"source": {"dir": "/mnt/nfs/glm5"}}))
    assert node_store_of(HOST) == NodeStore("/mnt/nfs/glm5", None, None, None, complete=True)
    node(monkeypatch, None)
    assert node_store_of(HOST) is None


def test_a_vm_node_without_virtiofs_keeps_no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    node(monkeypatch, HUB, profile="vm", qemu_server=(8, 3, 10), read=(None, None))
    assert node_store_of(HOST) is None
    node(monkeypatch, HUB, profile="vm", qemu_server=(8, 3, 11), read=(None, None))
    assert node_store_of(HOST) is not None


GUEST = SglangSpec(model_path="/srv/models/GLM-5-NVFP4-MTP", model_repo=REPO, model_share="virtiofs")
OWN = FetchTarget(REPO, None, None, None, "/srv/models/GLM-5-NVFP4-MTP", "sglang")


def guest(
    monkeypatch: pytest.MonkeyPatch, spec: SglangSpec, qemu_server: tuple[int, int, int] | None
) -> None:
    monkeypatch.setattr(serving, "plan_of", lambda _host: SimpleNamespace(specs=SimpleNamespace(sglang=spec)))
    monkeypatch.setattr(serving, "node_host_of", lambda _host: object())
    state = SimpleNamespace(cpu_kernel=SimpleNamespace(qemu_server=qemu_server))
    monkeypatch.setattr(serving, "node_state_of", lambda _host: state)


@pytest.mark.parametrize(
    ("spec", "qemu_server", "fetch"),
    [
        (GUEST, (9, 2, 6), None),
        (GUEST.model_copy(update={"model_share": "bind"}), (8, 3, 10), None),
        (GUEST.model_copy(update={"model_share": None}), (9, 2, 6), OWN),
        (SglangSpec(), (9, 2, 6), None),
    ],
)
def test_a_host_that_sees_its_nodes_store_fetches_nothing(
    monkeypatch: pytest.MonkeyPatch, spec: SglangSpec, qemu_server: tuple[int, int, int], fetch: object
) -> None:
    guest(monkeypatch, spec, qemu_server)
    assert serving.own_fetch(HOST) == fetch


def test_a_vm_guest_of_a_node_without_virtiofs_fetches_itself_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    guest(monkeypatch, GUEST, (8, 3, 10))
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert serving.own_fetch(HOST) == OWN
    assert [record.getMessage() for record in caplog.records] == [
        "[pve1] model: the node's qemu-server 8.3.10 has no virtiofs (Proxmox VE 8.4+): fetched into "
        "/srv/models/GLM-5-NVFP4-MTP here, verified as on the node"
    ]
