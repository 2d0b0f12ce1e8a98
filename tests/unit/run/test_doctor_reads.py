"""pvegpu/run/doctor_reads.py: what the node doctor reads through the Proxmox API and of the hook's files on
the node, and a failed read as its one line (`NotRead`), never raised."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pyinfra.facts.files import Sha256File

from pvegpu.hook.bundle import BUNDLE_PATH, build, wrapper
from pvegpu.models.doctor import HookRead, NodeFile, NotRead
from pvegpu.models.pve import GuestConfig, MappingState, PciMapping, StorageConfig
from pvegpu.pve.errors import PveError
from pvegpu.pve.host_client import PveSetupError
from pvegpu.run import doctor_reads
from tests.unit.op_harness import FakeHost
from tests.unit.plan.test_doctor import node_plan

GPU0 = PciMapping("gpu0", ("id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14",))
WRAPPER = "/var/lib/vz/snippets/pvegpu-hook"


class Api:
    """The client calls the doctor makes, answered from fixed values; `failure` raised by every call."""

    def __init__(self, failure: Exception | None = None, hookscript: str | None = None) -> None:
        self.failure = failure
        self.hookscript = hookscript
        self.calls: list[str] = []

    def _call(self, call: str) -> None:
        self.calls.append(call)
        if self.failure is not None:
            raise self.failure

    def permissions(self, path: str) -> frozenset[str]:
        self._call(f"permissions {path}")
        return frozenset({"VM.Audit"})

    def mappings(self) -> tuple[MappingState, ...]:
        self._call("mappings")
        return (MappingState(GPU0, "d1"),)

    def vm_config(self, node: str, vmid: int) -> GuestConfig:
        self._call(f"vm_config {node} {vmid}")
        return GuestConfig({} if self.hookscript is None else {"hookscript": self.hookscript}, "d2")

    def storage(self, storage: str) -> StorageConfig:
        self._call(f"storage {storage}")
        return StorageConfig(storage, ("snippets",), "/var/lib/vz", "d3")


class FileHost(FakeHost):
    """A host whose `Sha256File` answers per path (None: no such file)."""

    def __init__(self, files: dict[str, str | None]) -> None:
        super().__init__({})
        self.files = files

    def get_fact(self, fact: type, *_args: object, **kwargs: Any) -> object:
        assert fact is Sha256File
        return self.files[kwargs["path"]]


def with_api(monkeypatch: pytest.MonkeyPatch, api: Api) -> Api:
    monkeypatch.setattr(doctor_reads, "pve_client", lambda _host: api)
    return api


def test_granted_privileges_per_path_and_mappings_as_sections(monkeypatch: pytest.MonkeyPatch) -> None:
    api = with_api(monkeypatch, Api())
    host: Any = FakeHost({})
    assert doctor_reads.granted_privileges(host, ("/vms/100", "/")) == {
        "/vms/100": frozenset({"VM.Audit"}),
        "/": frozenset({"VM.Audit"}),
    }
    assert doctor_reads.vm_mappings(host) == (GPU0,)
    assert api.calls == ["permissions /vms/100", "permissions /", "mappings"]


@pytest.mark.parametrize(
    ("failure", "line"),
    [
        (
            PveError(403, "Permission check failed (/vms/100, VM.Audit)\n"),
            "Permission check failed (/vms/100, VM.Audit)",
        ),
        (PveSetupError("pve: no address for pve1"), "pve: no address for pve1"),
    ],
)
def test_error_a_failed_read_is_its_one_line(
    monkeypatch: pytest.MonkeyPatch, failure: Exception, line: str
) -> None:
    with_api(monkeypatch, Api(failure))
    host: Any = FakeHost({})
    assert doctor_reads.granted_privileges(host, ("/vms/100",)) == NotRead(line)
    assert doctor_reads.vm_mappings(host) == NotRead(line)
    assert doctor_reads.hook_read(host, node_plan()) == NotRead(line)


def test_noop_hook_off_reads_no_file_of_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    api = with_api(monkeypatch, Api(hookscript="local:snippets/pvegpu-hook"))
    host: Any = FileHost({})  # any file read fails the test
    plan = node_plan(vm={"vmid": 100, "name": "llm", "cores": 4, "memory": 8192, "self_heal": "off"})
    assert doctor_reads.hook_read(host, plan) == HookRead("local:snippets/pvegpu-hook")
    assert api.calls == ["vm_config pve1 100", "storage local"]


def test_hook_read_compares_the_node_files_with_the_bytes_this_pvegpu_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_api(monkeypatch, Api())
    bundle = build()
    host: Any = FileHost({WRAPPER: None, BUNDLE_PATH: bundle.sha256})
    read = doctor_reads.hook_read(host, node_plan())
    assert isinstance(read, HookRead)
    assert (read.hookscript, read.version) == (None, bundle.version)
    assert [(file.path, file.found) for file in read.files] == [(WRAPPER, None), (BUNDLE_PATH, bundle.sha256)]
    assert read.files[1] == NodeFile(BUNDLE_PATH, bundle.sha256, hashlib.sha256(bundle.data).hexdigest())
    # the wrapper names the inventory's owner (no pve.owner nor cluster: the node) and the node's sysfs
    text = wrapper(bundle, mode="repair", prefix="gpu", owner="pve1", sysfs_root="/sys")
    assert read.files[0].wanted == hashlib.sha256(text.encode()).hexdigest()
