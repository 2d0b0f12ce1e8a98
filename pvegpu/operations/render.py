"""Render files written on hosts from `templates/<role>/<name>.j2`: StrictUndefined, deterministic."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"

_ENV = Environment(
    loader=FileSystemLoader(TEMPLATES),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)


def render(template: str, **values: object) -> str:
    """`render("pve_host/grub-pvegpu.cfg.j2", tokens=[...])` -> the file's content."""
    return _ENV.get_template(template).render(**values)
