"""Garbage from every endpoint pvegpu calls, through the pvesh backend: each answer that is not the API's
(an HTML page, a reply cut off mid-way, JSON of the wrong shape, data from a call that returns none) is a
PveResponseError whose one line names the endpoint and quotes the answer's first line; no traceback-only
KeyError or TypeError escapes. Operations turn these lines into their host's error (test_ops_mapping.py,
test_ops_vm.py). Answers are synthesized; the good shapes follow proxmox-api-behaviour.md §3-6.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pvegpu.models.pve import PciMapping
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveResponseError, Unparsed
from pvegpu.pve.https import HttpsTransport
from pvegpu.pve.transport import CommandTransport

UPID = "UPID:pve1:0000A1B2:0153F2C4:66A1B2C3:qmstart:100:root@pam:"
HTML = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>\n"
MAPPING = PciMapping("gpu0", ("id=10de:2bb1,node=pve1,path=0000:41:00",))

Call = Callable[[PveClient], object]
# endpoint, what a good answer is, the call
READS: list[tuple[str, str, Call]] = [
    ("GET /cluster/mapping/pci", "a list", lambda api: api.mappings(check_node="pve1")),
    ("GET /cluster/mapping/pci/gpu0", "an object", lambda api: api.mapping("gpu0")),
    ("GET /nodes/pve1/qemu/100/config", "an object", lambda api: api.vm_config("pve1", 100)),
    ("GET /nodes/pve1/qemu/100/status/current", "an object", lambda api: api.vm_status("pve1", 100)),
    ("GET /nodes/pve1/lxc/200/config", "an object", lambda api: api.lxc_config("pve1", 200)),
    ("GET /nodes/pve1/lxc/200/status/current", "an object", lambda api: api.lxc_status("pve1", 200)),
    (f"GET /nodes/pve1/tasks/{UPID}/status", "an object", lambda api: api.task_status(UPID)),
    ("GET /nodes/pve1/tasks", "a list", lambda api: api.guest_tasks("pve1", 100)),
]
TASKS: list[tuple[str, Call]] = [
    ("POST /nodes/pve1/qemu", lambda api: api.create_vm("pve1", 100, {"name": "llm"})),
    ("POST /nodes/pve1/qemu/100/status/start", lambda api: api.start_vm("pve1", 100)),
    ("POST /nodes/pve1/qemu/100/status/stop", lambda api: api.stop_vm("pve1", 100)),
    ("POST /nodes/pve1/lxc", lambda api: api.create_lxc("pve1", 200, {"hostname": "ct"})),
    ("POST /nodes/pve1/lxc/200/status/start", lambda api: api.start_lxc("pve1", 200)),
    ("POST /nodes/pve1/lxc/200/status/stop", lambda api: api.stop_lxc("pve1", 200)),
    ("POST /nodes/pve1/lxc/200/status/shutdown", lambda api: api.shutdown_lxc("pve1", 200, 60)),
]
NULL_WRITES: list[tuple[str, Call]] = [
    ("POST /cluster/mapping/pci", lambda api: api.create_mapping(MAPPING)),
    ("PUT /cluster/mapping/pci/gpu0", lambda api: api.update_mapping(MAPPING, "d1")),
    ("DELETE /cluster/mapping/pci/gpu0", lambda api: api.delete_mapping("gpu0")),
    ("PUT /nodes/pve1/qemu/100/config", lambda api: api.update_vm_config("pve1", 100, {"onboot": 0}, "d1")),
    ("PUT /nodes/pve1/lxc/200/config", lambda api: api.update_lxc_config("pve1", 200, {"onboot": 0}, "d1")),
]


def pvesh(stdout: str) -> PveClient:
    """A client whose pvesh prints `stdout` and exits 0."""
    return PveClient(CommandTransport(lambda _argv: (stdout, "", 0)))


def line_of(call: Call, stdout: str) -> str:
    with pytest.raises(PveResponseError) as error:
        call(pvesh(stdout))
    return error.value.line


@pytest.mark.parametrize(("endpoint", "good", "call"), READS, ids=[e for e, _, _ in READS])
@pytest.mark.parametrize(
    ("stdout", "got"),
    [
        (HTML, "'<!DOCTYPE html>'"),
        ('{"digest":"d1","map":["id=10de:2bb1,no\n', """'{"digest":"d1","map":["id=10de:2bb1,no'"""),
        ("", "nothing"),
        ('"a string"\n', """'"a string"'"""),
    ],
    ids=["html", "cut", "empty", "string"],
)
def test_error_garbage_from_a_read_names_the_endpoint(
    endpoint: str, good: str, call: Call, stdout: str, got: str
) -> None:
    assert line_of(call, stdout) == f"{endpoint}: expected {good}, got {got}"


@pytest.mark.parametrize(
    ("call", "stdout", "line"),
    [
        (
            READS[0][2],
            '[{"digest":"d1","id":"gpu0","map":"id=10de:2bb1,node=pve1,path=0000:41:00"}]\n',
            "GET /cluster/mapping/pci: expected a list, got "
            """'[{"digest": "d1", "id": "gpu0", "map": "id=10de:2bb1,node=pve1,path=0000:41:00"}]'""",
        ),
        (
            READS[0][2],
            '[{"checks":[{"message":"x"}],"digest":"d1","id":"gpu0","map":[]}]\n',
            "GET /cluster/mapping/pci: expected an object with 'severity', got "
            """'[{"checks": [{"message": "x"}], "digest": "d1", "id": "gpu0", "map": []}]'""",
        ),
        (
            READS[0][2],
            '[{"checks":[{"message":"x","severity":"fatal"}],"digest":"d1","id":"g","map":[]}]\n',
            "GET /cluster/mapping/pci: expected Proxmox's format ('fatal' is not a valid Severity), got "
            """'[{"checks": [{"message": "x", "severity": "fatal"}], """
            """"digest": "d1", "id": "g", "map": []}]'""",
        ),
        (
            READS[1][2],
            '{"map":[],"type":"pci"}\n',
            "GET /cluster/mapping/pci/gpu0: expected an object with 'digest', got "
            """'{"map": [], "type": "pci"}'""",
        ),
        (
            READS[2][2],
            '{"cores":8}\n',
            """GET /nodes/pve1/qemu/100/config: expected a config with a 'digest', got '{"cores": 8}'""",
        ),
        (
            READS[3][2],
            '{"status":"running"}\n',
            "GET /nodes/pve1/qemu/100/status/current: expected an object with 'vmid', got "
            """'{"status": "running"}'""",
        ),
        (
            READS[3][2],
            '{"status":"running","vmid":"1oo"}\n',
            "GET /nodes/pve1/qemu/100/status/current: expected an integer 'vmid', got "
            """'{"status": "running", "vmid": "1oo"}'""",
        ),
        (
            READS[5][2],
            '{"status":null}\n',
            """GET /nodes/pve1/lxc/200/status/current: expected a string 'status', got '{"status": null}'""",
        ),
        (
            READS[6][2],
            '{"exitstatus":"OK"}\n',
            f"GET /nodes/pve1/tasks/{UPID}/status: expected an object with 'status', got "
            """'{"exitstatus": "OK"}'""",
        ),
    ],
)
def test_error_json_of_the_wrong_shape_names_the_endpoint_and_what_was_missing(
    call: Call, stdout: str, line: str
) -> None:
    assert line_of(call, stdout) == line


@pytest.mark.parametrize(("endpoint", "call"), TASKS, ids=[e for e, _ in TASKS])
@pytest.mark.parametrize(
    ("stdout", "got"),
    [
        (HTML, "'<!DOCTYPE html>'"),
        ('"UPID:pve1:0000A1B2:01\n', """'"UPID:pve1:0000A1B2:01'"""),
        ("", "nothing"),
        ('{"data":null}\n', """'{"data": null}'"""),
        ('"not a task"\n', """'"not a task"'"""),
    ],
    ids=["html", "cut", "empty", "object", "string"],
)
def test_error_a_task_call_without_a_upid_names_the_endpoint(
    endpoint: str, call: Call, stdout: str, got: str
) -> None:
    assert line_of(call, stdout) == f"{endpoint}: expected a task id (UPID), got {got}"


@pytest.mark.parametrize(("endpoint", "call"), NULL_WRITES, ids=[e for e, _ in NULL_WRITES])
def test_error_data_from_a_write_that_returns_none_names_the_endpoint(endpoint: str, call: Call) -> None:
    assert line_of(call, '{"id":"gpu0"}\n') == f"""{endpoint}: expected no data, got '{{"id": "gpu0"}}'"""


@pytest.mark.parametrize(("endpoint", "call"), NULL_WRITES, ids=[e for e, _ in NULL_WRITES])
def test_text_from_a_write_that_returns_none_is_left_to_the_read_back(endpoint: str, call: Call) -> None:
    # pvesh prints a handler's own lines there (`update VM 100: -onboot 0`): text proves nothing either
    # way, so the operations read back what they wrote (test_ops_mapping.py, test_ops_vm.py).
    del endpoint
    assert call(pvesh(HTML)) is None


def test_error_a_failed_call_names_its_endpoint_in_its_line() -> None:
    stderr = "400 Parameter verification failed.\nmap[0]: invalid format - value without key\n"
    api = PveClient(CommandTransport(lambda _argv: ("", stderr, 255)))
    with pytest.raises(Exception) as error:  # noqa: PT011 - the exact line is asserted below
        api.create_mapping(MAPPING)
    assert getattr(error.value, "line", None) == (
        "POST /cluster/mapping/pci: Parameter verification failed.; "
        "map[0]: invalid format - value without key"
    )


def test_https_body_that_is_not_json_is_unparsed() -> None:
    class Api:
        """proxmoxer's https resource: a body that is not JSON comes back as {"errors": <body>}."""

        def __call__(self, _path: str) -> Any:
            return self

        def get(self, **_params: Any) -> object:
            return {"errors": HTML.encode()}

    transport = HttpsTransport(Api())
    assert transport("GET", "/cluster/mapping/pci", {}) == Unparsed(HTML)
    with pytest.raises(PveResponseError) as error:
        PveClient(transport).mappings()
    assert error.value.line == "GET /cluster/mapping/pci: expected a list, got '<!DOCTYPE html>'"
