"""Errors of the planning layer."""

from __future__ import annotations


class PlanError(ValueError):
    """Declared input and observed state admit no plan; the message names the field and what was seen."""
