"""`shared_reads`: one API read per resource (a guest's config, the PCI mappings) until a write; statuses
and tasks always read, except that `read_ahead` sends a run's reads at once and the first read of each takes
that answer. Counted on the calls the scripted API receives, with the VM operations of
`deploy/site.py` run the way `pyinfra -y` runs them: each operation's reads, then its commands, in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent
import pytest

from pvegpu.operations.pve_guest import VM, Guest, guest_running
from pvegpu.operations.vm import q35_vm
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveConnectionLostError, PveError
from pvegpu.pve.host_client import read_ahead, seed, shared_reads
from pvegpu.pve.transport import Params
from tests.unit.fake_pve import UPID_CREATE, FakeApi, execute, sequence, task_ok
from tests.unit.op_harness import run_op
from tests.unit.operations.test_vm import (
    CONFIG_PATH,
    MISSING,
    PLAN,
    STATUS,
    created_config,
    status,
    vm_store,
)


def _site_vm_ops(client: PveClient) -> list[str]:
    """deploy/site.py's q35_vm role on a node: converge the config (executed), then start the VM (prepared
    only: a start is not what is counted here); the noop sentences of both."""
    common: dict[str, Any] = {"guest": Guest(VM, client, "pve1", 100), "timeout_s": 5}
    commands, converged = run_op(q35_vm, {}, vm=PLAN, **common)
    execute(commands)
    _, started = run_op(guest_running, {}, **common)
    return converged + started


def test_noop_site_reads_the_vm_config_once() -> None:
    answers: dict[tuple[str, str], object] = {
        ("GET", CONFIG_PATH): created_config(),
        ("GET", STATUS): status("running"),
    }
    shared, alone = FakeApi(answers), FakeApi(answers)

    noops = _site_vm_ops(shared_reads(shared.client))

    assert noops == [
        "VM 100 (llm) on pve1 has its config: q35, ovmf, 8 hostpci devices",
        "VM 100 is running on pve1",
    ]
    assert shared.calls == [("GET", CONFIG_PATH, {}), ("GET", STATUS, {})]
    # Without it the start operation reads the config again.
    assert _site_vm_ops(alone.client) == noops
    assert alone.calls == [("GET", CONFIG_PATH, {}), ("GET", CONFIG_PATH, {}), ("GET", STATUS, {})]


def test_create_run_reads_again_after_the_write() -> None:
    store = vm_store(None)
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("POST", "/nodes/pve1/qemu"): store.create(created_config(), UPID_CREATE),
            ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status"): task_ok(UPID_CREATE),
            ("GET", STATUS): status("stopped"),
        }
    )

    _site_vm_ops(shared_reads(api.client))

    assert [(method, path) for method, path, _ in api.calls] == [
        ("GET", CONFIG_PATH),  # missing: create it
        ("POST", "/nodes/pve1/qemu"),
        ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status"),
        ("GET", CONFIG_PATH),  # read back after the write
        ("GET", STATUS),  # the start operation: the read-back answer is shared, the status is read
    ]


def test_statuses_and_tasks_are_always_read() -> None:
    api = FakeApi({("GET", STATUS): sequence(status("stopped"), status("running"))})
    client = shared_reads(api.client)

    assert [client.vm_status("pve1", 100).status for _ in range(2)] == ["stopped", "running"]
    assert api.calls == [("GET", STATUS, {})] * 2


def test_reads_differ_by_parameters() -> None:
    path = "/cluster/mapping/pci"
    api = FakeApi({("GET", path): []})
    client = shared_reads(api.client)

    client.mappings(check_node="pve1")
    client.mappings(check_node="pve1")
    client.mappings()

    assert api.calls == [("GET", path, {"check-node": "pve1"}), ("GET", path, {})]


def test_a_shared_error_is_raised_again() -> None:
    api = FakeApi({("GET", CONFIG_PATH): MISSING})
    client = shared_reads(api.client)

    for _ in range(2):
        with pytest.raises(PveError, match=r"^500 Configuration file 'nodes/pve1/qemu-server/100\.conf'"):
            client.vm_config("pve1", 100)
    assert len(api.calls) == 1


# --- read_ahead: the run's reads sent at once ------------------------------------------------------------


class SlowApi(FakeApi):
    """A FakeApi whose every call takes `delay_s` of gevent time (a round trip to the node); `most`: the most
    calls it had on their way at once."""

    def __init__(self, answers: dict[tuple[str, str], object], delay_s: float = 0.05) -> None:
        super().__init__(answers)
        self.delay_s = delay_s
        self.on_the_way = self.most = 0

    def __call__(self, method: str, path: str, params: Params) -> object:
        self.on_the_way += 1
        self.most = max(self.most, self.on_the_way)
        try:
            gevent.sleep(self.delay_s)
            return super().__call__(method, path, params)
        finally:
            self.on_the_way -= 1


MAPPINGS = "/cluster/mapping/pci"
STORAGE = "/storage/local"
VM_READS: list[Callable[[PveClient], object]] = [
    lambda api: api.vm_config("pve1", 100),
    lambda api: api.vm_status("pve1", 100),
    lambda api: api.mappings(check_node="pve1"),
    lambda api: api.storage("local"),
]


def vm_answers() -> dict[tuple[str, str], object]:
    return {
        ("GET", CONFIG_PATH): created_config(),
        ("GET", STATUS): sequence(status("running"), status("stopped")),
        ("GET", MAPPINGS): [],
        ("GET", STORAGE): {"content": "images,snippets", "path": "/var/lib/vz", "digest": "d1"},
    }


def test_reads_sent_ahead_go_together_and_each_is_sent_once() -> None:
    api = SlowApi(vm_answers())
    client = shared_reads(api.client)

    read_ahead(client, VM_READS)
    noops = _site_vm_ops(client)
    client.mappings(check_node="pve1")
    client.storage("local")

    assert api.most == 4  # all four on their way together, not one after another
    assert noops == [
        "VM 100 (llm) on pve1 has its config: q35, ovmf, 8 hostpci devices",
        "VM 100 is running on pve1",
    ]
    assert sorted(path for _, path, _ in api.calls) == sorted([CONFIG_PATH, STATUS, MAPPINGS, STORAGE])


def test_a_status_read_ahead_answers_only_the_first_status_read() -> None:
    api = FakeApi(vm_answers())
    client = shared_reads(api.client)

    read_ahead(client, VM_READS[1:2])

    assert [client.vm_status("pve1", 100).status for _ in range(2)] == ["running", "stopped"]
    assert api.calls == [("GET", STATUS, {})] * 2


def test_a_write_drops_what_was_read_ahead() -> None:
    api = SlowApi({**vm_answers(), ("PUT", STORAGE): None}, delay_s=0.05)
    client = shared_reads(api.client)

    read_ahead(client, VM_READS[3:])
    client.update_storage_content("local", ["images", "snippets", "import"], "d1")  # before the answer
    client.storage("local")

    assert [(method, path) for method, path, _ in api.calls] == [
        ("GET", STORAGE),
        ("PUT", STORAGE),
        ("GET", STORAGE),
    ]


def test_what_a_read_ahead_raises_is_raised_to_the_read_that_takes_it() -> None:
    lost = PveConnectionLostError("ssh root@pve1:22: connection lost after the command was sent: EOFError")
    broken = RuntimeError("not an API error")

    def storage(_params: dict[str, Any]) -> object:
        raise broken

    api = FakeApi({("GET", CONFIG_PATH): lost, ("GET", STORAGE): storage})
    client = shared_reads(api.client)

    read_ahead(client, [VM_READS[0], VM_READS[3]])

    for _ in range(2):  # an API error is the read's answer, kept as a shared read keeps it
        with pytest.raises(PveConnectionLostError) as error:
            client.vm_config("pve1", 100)
        assert error.value is lost
    with pytest.raises(RuntimeError) as raised:  # anything else is raised once, not kept: the next read sends
        client.storage("local")
    assert raised.value is broken
    with pytest.raises(RuntimeError):
        client.storage("local")
    assert [path for _, path, _ in api.calls] == [CONFIG_PATH, STORAGE, STORAGE]


def test_nothing_is_read_ahead_on_a_client_without_shared_reads() -> None:
    api = FakeApi(vm_answers())
    read_ahead(api.client, VM_READS)
    gevent.sleep(0.01)
    assert api.calls == []


def test_a_seeded_answer_is_the_reads_until_a_write() -> None:
    api = FakeApi({**vm_answers(), ("PUT", STORAGE): None})
    client = shared_reads(api.client)
    answer = {"storage": "local", "type": "dir", "content": "images", "path": "/var/lib/vz", "digest": "d0"}

    assert seed(client, VM_READS[3], answer) is True
    assert [client.storage("local").digest for _ in range(2)] == ["d0", "d0"]
    assert api.calls == []  # never asked
    client.update_storage_content("local", ["images", "snippets"], "d0")
    assert client.storage("local").digest == "d1"  # a write: read from the API again
    assert [(method, path) for method, path, _ in api.calls] == [("PUT", STORAGE), ("GET", STORAGE)]


def test_what_is_not_seeded() -> None:
    api = FakeApi(vm_answers())
    client = shared_reads(api.client)
    assert seed(api.client, VM_READS[3], {"content": "images", "digest": "d0"}) is False  # not shared_reads
    assert seed(client, VM_READS[1], {"status": "running", "vmid": 100}) is False  # a status: always read
    assert (
        seed(client, VM_READS[3], {"content": "images"}) is False
    )  # the read's parser refuses it: no digest
    client.vm_config("pve1", 100)
    assert seed(client, VM_READS[0], {"digest": "d9"}) is False  # already read: the API's answer stays
    assert client.vm_config("pve1", 100).digest == created_config()["digest"]
    assert client.storage("local").digest == "d1"
    assert [path for _, path, _ in api.calls] == [CONFIG_PATH, STORAGE]
