"""`node_state_of` (pvegpu/run/node_state.py): one read per node and run, shared by greenlets that ask
while it is
on its way; operations decide from it until an operation on the node ran a command, then read what they need
on their own (the command line, the driver leftovers, one file's sha256), as does a path the read did not
cover."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import gevent
from pyinfra.api.host import Host
from pyinfra.facts.files import Sha256File

from pvegpu.facts.boot import KernelCmdline
from pvegpu.facts.host_driver import HostDriverFiles
from pvegpu.facts.node_read import NodeRead, NodeStateRequest
from pvegpu.hook.bundle import BUNDLE_PATH
from pvegpu.models.host_driver import HostDriverState
from pvegpu.models.node import NODE_KEY, NodeSpec
from pvegpu.models.spec_validation import spec_of
from pvegpu.models.vm import VmSpec
from pvegpu.plan.host_driver import DRIVER_FILES, DRIVER_UNITS
from pvegpu.run.node_state import (
    driver_leftovers,
    node_file_sha256,
    node_request,
    node_state_of,
    running_cmdline,
    unchanged_node_state,
)
from tests.unit.op_harness import NODE_DATA, FakeState, node_state


class ReadCountingHost:
    """A pyinfra host whose NodeRead takes `delay_s` (a round trip); each fact it is asked for is recorded."""

    name = "pve1"

    def __init__(self, delay_s: float = 0.05) -> None:
        self.data: dict[str, Any] = {**NODE_DATA, "node": {**NODE_DATA["node"], "sysfs_root": "/opt/sys"}}
        self.state = FakeState(self, diff=False)
        self.requests: list[NodeStateRequest] = []
        self.facts: list[tuple[type, dict[str, Any]]] = []
        self.delay_s = delay_s

    def get_fact(self, fact: type, **kwargs: Any) -> object:
        self.facts.append((fact, kwargs))
        if fact is Sha256File:
            return "ab" * 32
        if fact is KernelCmdline:
            return ("BOOT_IMAGE=/boot/vmlinuz", "amd_iommu=on")
        if fact is HostDriverFiles:
            return HostDriverState(files=(), units=())
        assert fact is NodeRead
        self.requests.append(kwargs["request"])
        gevent.sleep(self.delay_s)
        return node_state()

    def ran_an_operation(self) -> None:
        meta = SimpleNamespace(is_complete=lambda: True, executed=True)
        self.state.ops[self][f"op{len(self.state.ops[self])}"] = SimpleNamespace(operation_meta=meta)


def test_the_request_is_the_nodes_settings_and_pvegpus_files() -> None:
    target = ReadCountingHost()
    node_state_of(cast(Host, target))
    assert target.requests == [
        NodeStateRequest(
            sysfs_root="/opt/sys",
            cmdline_path="/proc/cmdline",
            driver_files=DRIVER_FILES,
            driver_units=DRIVER_UNITS,
            sha256_paths=(BUNDLE_PATH,),
            exporter_files=(
                "/var/lib/prometheus/node-exporter/pvegpu_node.prom",
                "/var/lib/prometheus/node-exporter/pvegpu_serving.prom",
                "/usr/local/sbin/pvegpu-sglang-gauges",
                "/etc/systemd/system/pvegpu-gauges.service",
                "/etc/systemd/system/pvegpu-gauges.timer",
            ),
        )
    ]


def test_a_vm_image_url_asks_for_its_file_digest_while_the_vm_does_not_exist() -> None:
    image = {"url": "https://x.example/d.qcow2", "checksum": "ab" * 32, "checksum_algorithm": "sha256"}
    request = node_request(
        spec_of(NODE_DATA, NODE_KEY, NodeSpec), VmSpec.model_validate({"vmid": 100, "image": image})
    )
    assert (request.image_files, request.image_unless) == (
        (("sha256", "d.qcow2"),),
        "/etc/pve/nodes/pve1/qemu-server/100.conf",
    )


def test_greenlets_asking_while_the_read_is_on_its_way_share_it() -> None:
    target = ReadCountingHost()
    states = [gevent.spawn(node_state_of, cast(Host, target)) for _ in range(3)]
    gevent.joinall(states)
    assert len(target.requests) == 1
    assert states[0].value is states[1].value is states[2].value


def test_after_a_change_operations_read_what_they_need_on_their_own() -> None:
    target = ReadCountingHost(delay_s=0)
    host = cast(Host, target)
    state = node_state_of(host)
    hook = "/var/lib/vz/snippets/pvegpu-hook"

    assert unchanged_node_state(host) is state
    assert running_cmdline(host, "/opt/proc/cmdline") == state.cmdline
    assert driver_leftovers(host) == state.driver
    assert node_file_sha256(host, hook) == state.sha256(hook)
    assert node_file_sha256(host, "/var/lib/vz/snippets/pvegpu-7-user.yaml") is None
    assert [fact for fact, _ in target.facts] == [NodeRead]

    target.ran_an_operation()

    assert unchanged_node_state(host) is None
    assert node_state_of(host) is state  # the plan's read: not read again
    assert running_cmdline(host, "/opt/proc/cmdline") == ("BOOT_IMAGE=/boot/vmlinuz", "amd_iommu=on")
    assert driver_leftovers(host) == HostDriverState(files=(), units=())
    assert node_file_sha256(host, hook) == "ab" * 32
    assert target.facts[1:] == [
        (KernelCmdline, {"cmdline_path": "/opt/proc/cmdline"}),
        (HostDriverFiles, {"files": DRIVER_FILES, "units": DRIVER_UNITS}),
        (Sha256File, {"path": hook}),
    ]


def test_a_path_the_read_did_not_cover_is_read_on_its_own() -> None:
    target = ReadCountingHost(delay_s=0)
    assert node_file_sha256(cast(Host, target), "/srv/snippets/pvegpu-hook") == "ab" * 32
    assert target.facts[1:] == [(Sha256File, {"path": "/srv/snippets/pvegpu-hook"})]
