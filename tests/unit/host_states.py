"""A `HostState` (pvegpu/facts/host_read.py) for operation tests, and a fixture-free way to make the
operations decide from it: `decide_from(monkeypatch, state)` answers every `state_of(host)` with `state`."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pvegpu.facts.host_read import HostState
from pvegpu.facts.sglang import VenvState
from pvegpu.models.guest_state import PathState, UnitState, UserEntry
from pvegpu.models.nvidia import LoadedModule, NvidiaSmi

# Every module whose operations read the state (each imported `state_of` by name).
_READERS = (
    "pvegpu.operations.from_state",
    "pvegpu.operations.nvidia",
    "pvegpu.operations.sglang",
    "pvegpu.operations.nccl_topo",
)


def host_state(
    *,
    paths: Mapping[str, PathState] | None = None,
    packages: Mapping[str, frozenset[str]] | None = None,
    units: Mapping[str, UnitState] | None = None,
    users: Mapping[str, UserEntry] | None = None,
    groups: frozenset[str] = frozenset(),
    venvs: Mapping[str, VenvState] | None = None,
    module: LoadedModule | None = None,
    smi: NvidiaSmi | None = None,
) -> HostState:
    """A Debian 12 host with only what is given (nothing installed, no file, no unit otherwise)."""
    return HostState(
        os_release={"ID": "debian", "VERSION_ID": "12"},
        kernel="6.1.0-28-amd64",
        packages=packages or {},
        paths=paths or {},
        units=units or {},
        users=users or {},
        groups=groups,
        venvs=venvs or {},
        module=module,
        smi=smi or NvidiaSmi((), "nvidia-smi printed nothing (not installed?)"),
    )


def decide_from(monkeypatch: pytest.MonkeyPatch, state: HostState) -> None:
    """Every operation's `state_of(host)` returns `state` for the rest of the test."""
    for module in _READERS:
        monkeypatch.setattr(f"{module}.state_of", lambda _host: state)
