"""pvegpu/run/vm.py `create_ledger`: the VM role's create records, beside the host's known_hosts file, for
the identity the create's POST of the VM plan's keys runs as (`acts_as`, asked of the host's client); and
`guest_ledger` of a container (the lxc role's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pvegpu.local.create_records import CreateLedger
from pvegpu.pve.transport import Method, Params
from pvegpu.run import vm
from tests.unit.op_harness import FakeHost
from tests.unit.plan.test_doctor import node_plan


class Api:
    """`acts_as` as the https backend with a root path answers: root@pam for a call with `hookscript`."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, dict[str, object]]] = []

    def acts_as(self, method: Method, path: str, params: Params) -> str:
        self.asked.append((method, path, dict(params)))
        return "root@pam" if "hookscript" in params else "pvegpu@pve!deploy"


def node_host(monkeypatch: pytest.MonkeyPatch, known_hosts: str | None, **data: Any) -> tuple[Any, Api]:
    """A node with `data` (its plan) and `known_hosts`, its client `Api`."""
    api, plan, host = Api(), node_plan(**data), FakeHost({})
    target: Any = host  # a pyinfra Host to the code under test
    target.data = {} if known_hosts is None else {"ssh_known_hosts_file": known_hosts}
    monkeypatch.setattr(vm, "plan_of", lambda _host: plan)
    monkeypatch.setattr(vm, "pve_client", lambda _host: api)
    return target, api


def ledger(monkeypatch: pytest.MonkeyPatch, known_hosts: str | None, **data: Any) -> tuple[object, Api]:
    target, api = node_host(monkeypatch, known_hosts, **data)
    return vm.create_ledger(target), api


def test_create_ledger_beside_known_hosts_for_the_creates_identity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    off = {"vmid": 100, "name": "llm", "cores": 4, "memory": 8192, "self_heal": "off"}
    found, api = ledger(monkeypatch, str(tmp_path / "known_hosts"), pve={"cluster": "lab"}, vm=off)
    keys = tmp_path / "guest-keys"
    assert found == CreateLedger(keys / "lab" / "tasks", "pvegpu@pve!deploy", keys / "tasks")
    [(method, path, params)] = api.asked
    assert (method, path) == ("POST", "/nodes/pve1/qemu")
    assert (params["name"], params["machine"], params["bios"]) == ("llm", "q35", "ovmf")
    assert "scsi0" in params  # the create-only keys too (plan/vm.py `VmPlan.created_with`)


def test_create_ledger_as_root_when_the_create_carries_a_root_only_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found, _ = ledger(monkeypatch, str(tmp_path / "known_hosts"))  # vm.self_heal repair: its hookscript
    assert isinstance(found, CreateLedger)
    assert found.api_user == "root@pam"


def test_noop_no_ledger_without_known_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ledger(monkeypatch, None)[0] is None


def test_guest_ledger_of_a_container_asks_for_its_create_on_the_nodes_lxc_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """roles/lxc_gpu.py: `guest_ledger(host, "lxc", <the container plan's created_with>)`."""
    target, api = node_host(monkeypatch, str(tmp_path / "known_hosts"), pve={"cluster": "lab"})
    keys = {"hostname": "ct", "dev0": "/dev/nvidia0,gid=44", "ostemplate": "local:vztmpl/debian.tar.zst"}
    found, store = vm.guest_ledger(target, "lxc", keys), tmp_path / "guest-keys"
    assert found == CreateLedger(store / "lab" / "tasks", "pvegpu@pve!deploy", store / "tasks")
    assert api.asked == [("POST", "/nodes/pve1/lxc", keys)]
