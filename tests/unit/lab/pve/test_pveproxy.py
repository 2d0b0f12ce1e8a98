"""The lab's pveproxy stand-in (lab/pve/pveproxy.py) on a local port, as a node runs it (a script beside the
pvesh and access stand-ins), driven through pvegpu's https client (pvegpu.pve.https, certificate pinned) and
raw HTTPS: Proxmox's statuses, reasons and bodies for success, 400, 403, 500, 401 and 501."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.pve import api_setup
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.pve.https import connect_https

PVEPROXY = Path(__file__).resolve().parents[4] / "lab/pve/pveproxy.py"
TOKEN = "pvegpu@pve!deploy"
SECRET = "5f0c3e4a-9d7b-4c61-8a2e-1b3f5d7e9a0c"


@dataclass
class Proxy:
    root: Path
    port: int
    fingerprint: str
    cert: Path

    def client(self) -> PveClient:
        return connect_https("127.0.0.1", TOKEN, SECRET, port=self.port, fingerprint=self.fingerprint)

    def raw(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        context = ssl.create_default_context(cafile=str(self.cert))
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=30)
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, response.reason, response.read()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    base = tmp_path_factory.mktemp("pveproxy")
    root = base / "root"
    fingerprint = api_setup.write_certificate(root, "pve1", "127.0.0.1")
    api_setup.write_access(root, SECRET)
    (base / "pve.json").write_text(
        json.dumps({"node": "pve1", "sysfs_root": str(base / "sys"), "root": str(root)})
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PVEGPU_LAB_PVE_CONFIG": str(base / "pve.json")}
    with (base / "pveproxy.log").open("w") as log:
        server = subprocess.Popen([sys.executable, str(PVEPROXY), str(port)], env=env, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, (base / "pveproxy.log").read_text()
                time.sleep(0.05)
        yield Proxy(root, port, fingerprint, root / "etc/pve/nodes/pve1/pve-ssl.pem")
    finally:
        server.terminate()
        server.wait(10)


def test_create_runs_as_the_token_and_the_task_names_it(proxy: Proxy) -> None:
    client = proxy.client()
    upid = client.create_vm("pve1", 100, {"name": "vm", "memory": 2048, "net0": "virtio,bridge=vmbr0"})
    assert upid.endswith(f":qmcreate:100:{TOKEN}:")
    assert client.wait_task(upid, 10).exitstatus == "OK"
    assert client.guest_tasks("pve1", 100)[0].upid == upid
    assert client.vm_config("pve1", 100).values["memory"] == "2048"


def test_error_statuses_and_reasons(proxy: Proxy) -> None:
    client = proxy.client()
    with pytest.raises(PveError) as died:
        client.create_vm("pve1", 101, {"args": "-S"})
    assert (died.value.status, died.value.message, died.value.errors) == (
        500,
        "only root can set 'args' config",
        {},
    )
    with pytest.raises(PveError) as param:
        client.unlock_vm("pve1", 100, "0" * 40)
    assert (param.value.status, param.value.message) == (400, "Parameter verification failed.")
    assert param.value.errors == {"skiplock": "Only root may use this option."}
    with pytest.raises(PveError) as denied:
        client.create_vm("pve1", 102, {"hostpci0": "mapping=gpu0", "cores": 2, "serial0": "/dev/ttyS0"})
    assert (denied.value.status, denied.value.message) == (
        500,
        "only root can set 'serial0' config for real devices",
    )
    cfg = proxy.root / "etc/pve/user.cfg"
    cfg.write_text(cfg.read_text().replace("VM.Config.CPU,", ""))
    try:
        with pytest.raises(PveError) as forbidden:
            client.create_vm("pve1", 103, {"cores": 2})
        assert (forbidden.value.status, forbidden.value.message) == (
            403,
            "Permission check failed (/vms/103, VM.Config.CPU)",
        )
    finally:
        cfg.write_text(api_setup.user_cfg())


def test_raw_answers_without_a_token_and_for_unknown_paths(proxy: Proxy) -> None:
    auth = {"Authorization": f"PVEAPIToken={TOKEN}={SECRET}"}
    status, reason, body = proxy.raw("GET", "/api2/json/version", auth)
    assert (status, reason, json.loads(body)) == (
        200,
        "OK",
        {"data": {"release": "9.0", "repoid": "7eeb06a0", "version": "9.0.3"}},
    )
    assert proxy.raw("GET", "/api2/json/nodes/pve1/nothing", auth)[:2] == (
        501,
        "Method 'GET /nodes/pve1/nothing' not implemented",
    )
    status, reason, body = proxy.raw("GET", "/api2/json/version?bogus=1", auth)
    assert (status, reason) == (400, "Parameter verification failed.")
    expected = "property is not defined in schema and the schema does not allow additional properties"
    assert json.loads(body)["errors"] == {"bogus": expected}
    started = time.monotonic()
    assert proxy.raw("GET", "/api2/json/version", {}) == (401, "No ticket", b"")
    assert time.monotonic() - started >= 3.0  # pveproxy delays every unauthorized answer


def test_directory_mapping_statuses(proxy: Proxy) -> None:
    """pve-manager Mapping/Dir.pm over HTTPS: create 200, an existing id 500, a relative path 400, a stale
    digest 500, without Mapping.Modify 403."""
    auth = {"Authorization": f"PVEAPIToken={TOKEN}={SECRET}"}
    (proxy.root / "srv/models").mkdir(parents=True)
    create = "/api2/json/cluster/mapping/dir?id=models&map=node%3Dpve1%2Cpath%3D%2Fsrv%2Fmodels"

    assert proxy.raw("POST", create, auth) == (200, "OK", b'{"data": null}')
    status, reason, body = proxy.raw("POST", create, auth)
    assert (status, reason, json.loads(body)["message"]) == (
        500,
        "create directory mapping failed: dir ID 'models' already defined",
        "create directory mapping failed: dir ID 'models' already defined\n",
    )
    status, reason, body = proxy.raw(
        "POST", "/api2/json/cluster/mapping/dir?id=xy&map=node%3Dpve1%2Cpath%3Dm", auth
    )
    assert (status, reason, json.loads(body)["errors"]) == (
        400,
        "Parameter verification failed.",
        {
            "map[0].path": "invalid format - Value does not look like a valid absolute path."
            " These symbols are currently not allowed in path: ;,=()"
        },
    )
    stale = "/api2/json/cluster/mapping/dir/models?map=node%3Dpve2%2Cpath%3D%2Fm&digest=" + "0" * 40
    assert proxy.raw("PUT", stale, auth)[:2] == (
        500,
        "update directory mapping failed: detected modified configuration - file changed by other user?"
        " Try again.",
    )
    cfg = proxy.root / "etc/pve/user.cfg"
    cfg.write_text(cfg.read_text().replace("Mapping.Modify,", ""))
    try:
        assert proxy.raw("DELETE", "/api2/json/cluster/mapping/dir/models", auth)[:2] == (
            403,
            "Permission check failed (/mapping/dir, Mapping.Modify)",
        )
    finally:
        cfg.write_text(api_setup.user_cfg())
