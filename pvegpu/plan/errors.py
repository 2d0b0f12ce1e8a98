"""Errors of the planning layer: one family. Every planner raises a `PlanError` (or a subclass that carries
more, as `MappingPlanError` its problem lines); the run turns it into pyinfra's OperationError in one place,
`pvegpu.run.plan.plan_failures`."""

from __future__ import annotations


class PlanError(ValueError):
    """Declared input and observed state admit no plan; the message names the field and what was seen."""
