"""The lab's one error family: whatever the lab cannot do (start a host, build a root or a payload, read a
topology, run a stand-in's guest) raises a `LabError`, which `python -m lab` and the tests' fixtures print as
one `lab: <message>` line. Standard library only: every lab module may import it."""

from __future__ import annotations


class LabError(RuntimeError):
    """A lab host, root, payload or topology could not be made or used; the message says why and what to
    do."""
