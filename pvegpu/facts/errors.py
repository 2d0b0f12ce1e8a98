"""Errors of the facts layer.

pyinfra 3.10 (`pyinfra.api.facts._get_fact`) catches only `FactProcessError` raised by a fact's `process`:
it logs `FactParseError: <message>` plus "could not process fact: <name>" for that host, marks the host
failed (unless `_ignore_errors`) and lets the other hosts go on. Any other exception escapes as a traceback
that stops the whole run. So `FactParseError` is a `FactProcessError` as well as a `ValueError` (and the pure
parsers' `ParseError`), and the facts raise it from `process` without any glue. pyinfra prints `__cause__`
instead of the exception when there is one, so a FactParseError that wraps another error is raised
`from None`: its own message is the one to show.

The parsers the node's hook shares (pvegpu/facts/parsing.py, hardware_parse.py) import no pyinfra and raise
`ParseError`; `fact_errors` gives their fact-side form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from pyinfra.api.exceptions import FactProcessError

from pvegpu.facts.parsing import FactCommandError, ParseError

__all__ = ["FactCommandError", "FactParseError", "fact_errors"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class FactParseError(ParseError, FactProcessError):
    """A fact command's output does not have the expected shape.

    The message names what was wrong: the device address and attribute (`0000:41:00.0: vendor: ...`) or the
    output line (`line 7: ...`).
    """


def fact_errors(parse: Callable[_P, _T]) -> Callable[_P, _T]:
    """`parse` (a pure parser) whose `ParseError` is raised as a `FactParseError` with the same message."""

    @functools.wraps(parse)
    def parsed(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return parse(*args, **kwargs)
        except FactParseError:
            raise
        except ParseError as error:
            raise FactParseError(str(error)) from None

    return parsed
