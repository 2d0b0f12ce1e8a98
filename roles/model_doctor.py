"""model_doctor: the read-only report of a serving host's model (deploy/doctor.py): with `sglang.model_repo`,
whether `sglang.model_path` holds the verified revision as the fetcher left it (one command: its record and
the directory's file list), else what the next `deploy/site.py` fetches again (plan/model_fetch.py
`model_findings`)."""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.plan.model_fetch import model_findings
from pvegpu.run.plan import plan_of
from pvegpu.run.reports import log_findings, model_store


@deploy("Report the model's completeness")
def model_report() -> None:
    spec = plan_of(host).specs.sglang
    if spec.model_repo is None:
        return
    record, files = model_store(host, spec.model_path)
    log_findings(host, model_findings(spec, record, files))
