"""`shared_reads`: one API read per resource (a guest's config, the PCI mappings) until a write; statuses
and tasks always read. Counted on the calls the scripted API receives, with the VM operations of
`deploy/site.py` run the way `pyinfra -y` runs them: each operation's reads, then its commands, in order."""

from __future__ import annotations

from typing import Any

import pytest

from pvegpu.facts.pve import shared_reads
from pvegpu.operations.pve_guest import VM, guest_running
from pvegpu.operations.vm import q35_vm
from pvegpu.pve import PveClient, PveError
from tests.unit.fake_pve import UPID_CREATE, FakeApi, execute, sequence, task_ok
from tests.unit.op_harness import run_op
from tests.unit.test_ops_vm import (
    CONFIG,
    CONFIG_PATH,
    CREATE,
    MISSING,
    STATUS,
    created_config,
    status,
    vm_store,
)


def _site_vm_ops(client: PveClient) -> list[str]:
    """deploy/site.py's q35_vm role on a node: converge the config (executed), then start the VM (prepared
    only: a start is not what is counted here); the noop sentences of both."""
    common: dict[str, Any] = {"api": client, "node": "pve1", "vmid": 100, "timeout_s": 5}
    commands, converged = run_op(q35_vm, {}, config=CONFIG, create=CREATE, prefix="gpu", **common)
    execute(commands)
    _, started = run_op(guest_running, {}, kind=VM, **common)
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
