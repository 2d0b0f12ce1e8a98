"""The one place pvegpu's operations build the shell commands that write files."""

from __future__ import annotations

from pyinfra.api.command import QuoteString, StringCommand


def write_file(path: str, content: str) -> StringCommand:
    """`printf '%s' CONTENT > PATH`, both quoted; the parent directory must exist."""
    return StringCommand("printf", "%s", QuoteString(content), ">", QuoteString(path))
