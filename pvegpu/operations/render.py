"""Render files written on hosts from `templates/<role>/<name>.j2`: StrictUndefined, deterministic.

Compiled templates are kept in jinja2's own bytecode cache (a 0700 directory of the user's in the temp
directory, checked by jinja2, keyed by each template's source checksum): compiling the site's templates
cost ~0.1 s of every run. Where that directory is unsafe or cannot be made, templates compile each run."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemBytecodeCache, FileSystemLoader, StrictUndefined

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def _bytecode_cache() -> FileSystemBytecodeCache | None:
    try:
        return FileSystemBytecodeCache()
    except (OSError, RuntimeError):  # jinja2 refuses a directory another user owns or can write
        return None


_ENV = Environment(
    loader=FileSystemLoader(TEMPLATES),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
    bytecode_cache=_bytecode_cache(),
)


def render(template: str, **values: object) -> str:
    """`render("pve_host/grub-pvegpu.cfg.j2", tokens=[...])` -> the file's content."""
    return _ENV.get_template(template).render(**values)
