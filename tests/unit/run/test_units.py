"""pvegpu.run.units `reload_if`: a unit's reload follows this run's write or the host's state read
(NeedDaemonReload); a unit the read does not show (no systemd running) follows the write alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
from pyinfra.api.host import Host
from pyinfra.api.operation import OperationMeta

from pvegpu.models.guest_state import UnitState
from pvegpu.run.units import reload_if
from tests.unit.host_states import host_state

UNIT = "pvegpu-model-fetch.service"
TARGET = cast(Host, SimpleNamespace(name="guest"))


def written(changed: bool) -> OperationMeta:
    """An operation that wrote the unit's file in this run (`changed`) or found it as it should be."""
    return cast(OperationMeta, SimpleNamespace(did_change=lambda: changed))


@pytest.fixture
def units(monkeypatch: pytest.MonkeyPatch) -> dict[str, UnitState]:
    read: dict[str, UnitState] = {}
    monkeypatch.setattr("pvegpu.run.units.state_of", lambda _target: host_state(units=read))
    return read


@pytest.mark.parametrize(
    ("needs_reload", "changed", "reloads"),
    [(False, False, False), (False, True, True), (True, False, True), (True, True, True)],
    ids=["loaded-unchanged", "written-now", "written-by-a-stopped-run", "both"],
)
def test_reload_when_written_now_or_systemd_holds_an_older_file(
    units: dict[str, UnitState], needs_reload: bool, changed: bool, reloads: bool
) -> None:
    units[UNIT] = UnitState(running=False, enabled=False, needs_reload=needs_reload)
    assert reload_if(TARGET, UNIT, written(changed))() is reloads


@pytest.mark.usefixtures("units")  # none in the read: no systemd running
@pytest.mark.parametrize("changed", [False, True])
def test_a_unit_the_read_does_not_show_reloads_only_when_written(changed: bool) -> None:
    assert reload_if(TARGET, UNIT, written(changed))() is changed
