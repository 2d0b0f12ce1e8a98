"""The node exporter's operations (pvegpu/operations/node_exporter.py): the exporter's state and pvegpu's
textfiles from the host's one state read in, the exact commands or noop sentences out; on a Proxmox node a
no-op asks nothing but that read (pvegpu/run/exporter.py), also after the read was shared with the plan."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pyinfra.context import ctx_host

from pvegpu.facts.exporter_read import ExporterRead
from pvegpu.facts.node_read import NodeRead
from pvegpu.models.exporter import NODE_FILE, SERVING_FILE, ExporterState
from pvegpu.models.guest_state import MISSING, PathState, UnitState
from pvegpu.operations import node_exporter
from pvegpu.operations.files import write_file
from pvegpu.operations.node_exporter import exporter_package, exporter_service, gauge_file
from tests.unit.host_states import host_state
from tests.unit.op_harness import FakeHost, node_state

GAUGES = 'pvegpu_mapping_healthy{mapping="gpu0",node="pve1"} 1\n'
DIGEST = hashlib.sha256(GAUGES.encode()).hexdigest()
APT = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" install --no-install-recommends prometheus-node-exporter'
)
CONVERGED = ExporterState(True, True, True, True, {NODE_FILE: DIGEST, SERVING_FILE: None})
START = "systemctl start prometheus-node-exporter.service"
ENABLE = "systemctl enable prometheus-node-exporter.service"


class Node(FakeHost):
    """A Proxmox node whose facts are answered from `facts`, each fact asked recorded."""

    groups = ("pve_nodes",)

    def __init__(self, facts: dict[Any, object]) -> None:
        super().__init__(facts)
        self.asked: list[type] = []

    def get_fact(self, fact: type, *args: object, **kwargs: Any) -> object:
        self.asked.append(fact)
        return super().get_fact(fact, *args, **kwargs)


class Guest(FakeHost):
    """A VM guest (a serving host outside pve_nodes)."""

    groups = ("vm_guests",)


def run(target: FakeHost, op: Any, **kwargs: Any) -> tuple[list[str], list[str]]:
    with ctx_host.use(target):
        commands = [c if isinstance(c, str) else c.get_raw_value() for c in op._inner(**kwargs)]
    return commands, target.noops


def created(target: FakeHost, *, serving: bool) -> list[list[str]]:
    """The commands of the three operations on `target`, in order (each noop sentence in `target.noops`)."""
    return [
        run(target, exporter_package)[0],
        run(target, exporter_service)[0],
        run(target, gauge_file, serving=serving)[0],
    ]


def written(path: str) -> list[str]:
    return [write_file(path, GAUGES, mode="0644", owner="root:root").get_raw_value()]


@pytest.fixture(autouse=True)
def gauges(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files' content (pvegpu/run/gauges.py, tested on its own) is GAUGES."""
    monkeypatch.setattr(node_exporter, "node_gauges", lambda _host: GAUGES)
    monkeypatch.setattr(node_exporter, "serving_gauges", lambda _host: GAUGES)


def test_noop_converged_node_asks_nothing_but_its_one_read() -> None:
    node = Node({NodeRead: node_state(exporter=CONVERGED)})
    assert created(node, serving=False) == [[], [], []]
    assert node.noops == [
        "package prometheus-node-exporter is installed",
        "prometheus-node-exporter.service is running and enabled",
        f"{NODE_FILE} holds the gauges",
    ]
    assert node.asked == [NodeRead]  # read once, shared by the three (and by the node's other operations)


def test_create_on_a_fresh_node_installs_starts_enables_and_writes() -> None:
    fresh = ExporterState(False, False, False, True, {NODE_FILE: None, SERVING_FILE: None})
    node = Node({NodeRead: node_state(exporter=fresh)})
    assert created(node, serving=False) == [[APT], [START, ENABLE], written(NODE_FILE)]


def test_update_changed_gauges_are_written_again_and_a_stopped_unit_started() -> None:
    stale = ExporterState(True, False, True, True, {NODE_FILE: "0" * 64, SERVING_FILE: None})
    node = Node({NodeRead: node_state(exporter=stale)})
    assert created(node, serving=False) == [[], [START], written(NODE_FILE)]


def test_noop_without_systemd_the_unit_is_left_alone() -> None:
    bare = ExporterState(True, False, False, False, {NODE_FILE: DIGEST, SERVING_FILE: None})
    node = Node({NodeRead: node_state(exporter=bare)})
    assert run(node, exporter_service) == (
        [],
        ["no systemd on this host: prometheus-node-exporter.service is not started"],
    )


def test_after_a_change_the_node_reads_the_exporter_on_its_own() -> None:
    node = Node({NodeRead: node_state(exporter=None), ExporterRead: CONVERGED})
    assert run(node, gauge_file, serving=False) == ([], [f"{NODE_FILE} holds the gauges"])
    assert node.asked == [NodeRead, ExporterRead]


def test_error_a_textfile_the_read_did_not_look_for() -> None:
    node = Node({NodeRead: node_state(exporter=ExporterState(True, True, True, True, {}))})
    with pytest.raises(KeyError, match=r"pvegpu_node\.prom is not in the host's state read"):
        run(node, gauge_file, serving=False)


def test_serving_host_decides_from_its_state_read(monkeypatch: pytest.MonkeyPatch) -> None:
    state = host_state(
        packages={"prometheus-node-exporter": frozenset({"1.5.0-1+b6"})},
        units={"prometheus-node-exporter.service": UnitState(running=True, enabled=True)},
        paths={SERVING_FILE: PathState("file", "644", "root", "root", DIGEST)},
    )
    monkeypatch.setattr("pvegpu.run.exporter.state_of", lambda _host: state)
    guest = Guest({})
    assert created(guest, serving=True) == [[], [], []]
    assert guest.noops[-1] == f"{SERVING_FILE} holds the gauges"


def test_create_on_a_serving_host_without_the_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    state = host_state(paths={SERVING_FILE: MISSING})
    monkeypatch.setattr("pvegpu.run.exporter.state_of", lambda _host: state)
    assert created(Guest({}), serving=True) == [[APT], [START, ENABLE], written(SERVING_FILE)]
