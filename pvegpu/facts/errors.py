"""Errors of the facts layer.

pyinfra 3.10 (`pyinfra.api.facts._get_fact`) catches only `FactProcessError` raised by a fact's `process`:
it logs `FactParseError: <message>` plus "could not process fact: <name>" for that host, marks the host
failed (unless `_ignore_errors`) and lets the other hosts go on. Any other exception escapes as a traceback
that stops the whole run. So `FactParseError` is a `FactProcessError` as well as a `ValueError`, and the facts
raise it from `process` without any glue. pyinfra prints `__cause__` instead of the exception when there is
one, so a FactParseError that wraps another error is raised `from None`: its own message is the one to show.
"""

from __future__ import annotations

from pyinfra.api.exceptions import FactProcessError


class FactParseError(ValueError, FactProcessError):
    """A fact command's output does not have the expected shape.

    The message names what was wrong: the device address and attribute (`0000:41:00.0: vendor: ...`) or the
    output line (`line 7: ...`).
    """


class FactCommandError(RuntimeError):
    """A fact command run locally (offline CLI, tests) exited non-zero; the message carries its stderr."""
