"""model_doctor: the read-only report of a model's completeness (deploy/doctor.py): on a serving host with
`sglang.model_repo`, whether `sglang.model_path` holds the verified revision as the fetcher left it (one
command: its record and the directory's file list), else what the next `deploy/site.py` fetches again
(plan/model_fetch.py `model_findings`); on a Proxmox node with `model` fetched from a hub, the same of its
store, from the node's one state read (bare metal says it once, as the serving host it is)."""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.plan.model_fetch import model_findings, serving_fetch_target
from pvegpu.run.model_store import node_store_of
from pvegpu.run.plan import plan_of
from pvegpu.run.reports import log_findings, model_store


@deploy("Report the model's completeness")
def model_report() -> None:
    target = serving_fetch_target(plan_of(host).specs.sglang)
    if target is None:
        return
    record, files = model_store(host, target.path)
    log_findings(host, model_findings(target, record, files))


@deploy("Report the node's model store")
def node_model_report() -> None:
    store = node_store_of(host)  # from the node's one state read, which its plan read already
    if store is None or store.fetch is None or plan_of(host).specs.node.profile == "baremetal":
        return
    log_findings(host, model_findings(store.fetch.target, store.record, store.files))
