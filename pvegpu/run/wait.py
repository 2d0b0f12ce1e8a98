"""`wait_until`: the one poll loop pvegpu has, for everything it waits on (a Proxmox task, a guest's status,
a host coming back from a reboot, a service answering). No pyinfra: the API adapter uses it too."""

from __future__ import annotations

import time
from collections.abc import Callable


class WaitTimeoutError(Exception):
    """`wait_until` ran out of time. The text is `<what> after <timeout> s`; `last` is what the last check
    found still missing."""

    def __init__(self, what: str, timeout_s: float, last: str) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self.last = last
        super().__init__(f"{what} after {timeout_s:g} s")


def wait_until(
    pending: Callable[[], str | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 1.0,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> None:
    """Call `pending` until it returns None (the awaited state holds): once, then every `interval_s` seconds
    until `timeout_s` have passed. `pending` returns None, or a short text of what is still missing.

    Raises WaitTimeoutError(`what`, `timeout_s`, the last text) when time runs out. `clock` and `sleep`
    default to time.monotonic and time.sleep, looked up at each call (a test may patch them).
    """
    now = clock or time.monotonic
    deadline = now() + timeout_s
    while True:
        missing = pending()
        if missing is None:
            return
        if now() >= deadline:
            raise WaitTimeoutError(what, timeout_s, missing)
        (sleep or time.sleep)(interval_s)
