"""`node_store_of(host)`: the node's model store (`model`) as its one state read shows it: what the node
fetches (None for a `dir` source), the fetcher's record and the store's files (pvegpu/facts/node_read.py,
part `model`), and whether it is complete as verified."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyinfra.api.host import Host

from pvegpu.models.model_store import ModelRecord, StoreFile
from pvegpu.plan.model_fetch import ModelFetch, fetch_plan, fetch_reason, node_fetch_target
from pvegpu.plan.model_share import virtiofs_available
from pvegpu.run.node_state import node_state_of
from pvegpu.run.plan import plan_of


@dataclass(frozen=True)
class NodeStore:
    """The store's directory; `fetch`: what the node fetches into it (None: a `dir` source, served as it
    is); `record` and `files` as read; `complete`: verified and unchanged since (nothing to fetch)."""

    path: str
    fetch: ModelFetch | None
    record: ModelRecord | None
    files: Mapping[str, StoreFile] | None
    complete: bool


def node_store_of(target: Host) -> NodeStore | None:
    """Node `target`'s model store (module docstring); None without `model`, and on a `vm` node whose
    qemu-server has no virtiofs (its guest fetches the model itself: roles/q35_vm.py says so)."""
    specs = plan_of(target).specs
    model = specs.model
    if model is None:
        return None
    if specs.node.profile == "vm" and not virtiofs_available(node_state_of(target).cpu_kernel.qemu_server):
        return None
    target_ = node_fetch_target(model)
    if target_ is None:
        return NodeStore(model.path, None, None, None, complete=True)
    read = node_state_of(target).model
    record, files = read if read is not None else (None, None)
    complete = record is not None and fetch_reason(target_, record, files) is None
    return NodeStore(model.path, fetch_plan(target_), record, files, complete)
