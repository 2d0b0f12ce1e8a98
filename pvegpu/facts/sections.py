"""Fact commands that print several things mark each with a line `#pvegpu:<name>`; this splits them again.

The splitter is `pvegpu.facts.parsing.split_sections` (stdlib only); here it raises `FactParseError`, the form
pyinfra reports per host.
"""

from __future__ import annotations

from pvegpu.facts import parsing
from pvegpu.facts.errors import fact_errors

__all__ = ["MARKER", "marker", "split_sections"]

MARKER = parsing.MARKER
marker = parsing.marker
split_sections = fact_errors(parsing.split_sections)
