"""model_doctor: the read-only report of a serving host's model (deploy/doctor.py): with `sglang.model_repo`,
whether `sglang.model_path` holds the verified revision as the fetcher left it (one command: its record and
the directory's file list), else what the next `deploy/site.py` fetches again."""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host

from pvegpu.plan.model_fetch import complete_line, fetch_reason
from pvegpu.run.plan import plan_of
from pvegpu.run.reports import model_store


@deploy("Report the model's completeness")
def model_report() -> None:
    spec = plan_of(host).specs.sglang
    if spec.model_repo is None:
        return
    record, files = model_store(host, spec.model_path)
    reason = fetch_reason(spec, record, files)
    if reason is None and record is not None:
        logger.info(f"{host.print_prefix}model: {complete_line(spec, record)}")
    else:
        logger.warning(f"{host.print_prefix}model: {reason}; the next deploy/site.py fetches it")
