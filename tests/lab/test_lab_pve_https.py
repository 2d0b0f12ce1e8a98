"""A Proxmox lab node's HTTPS API through pvegpu's own client (pvegpu.pve.https, the certificate pinned by
fingerprint) with the API token the node was set up with (lab/pve/api_setup.py): the token creates a VM
without root-only keys (its task is the token's), one with `hookscript` is refused with Proxmox's text and
status before anything is written, and a wrong fingerprint or a wrong secret gets nowhere."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import hosts
from lab.pve import api_setup
from lab.pve import node as pve_node
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveConnectionError, PveError
from pvegpu.pve.https import connect_https

pytestmark = pytest.mark.lab

TOKEN_ID = "pvegpu@pve!deploy"
REPO = Path(__file__).resolve().parents[2]
PVE_DATA = "import json, runpy; print(json.dumps(dict(runpy.run_path('inventory/lab.py')['pve_nodes'])))"


def _lab_pve_data(backend: str | None) -> dict[str, object]:
    """Each lab node's `pve` data as inventory/lab.py gives it with PVEGPU_LAB_PVE_BACKEND=`backend`."""
    env = {k: v for k, v in os.environ.items() if k != "PVEGPU_LAB_PVE_BACKEND"}
    env |= {"PVEGPU_LAB_PVE_BACKEND": backend} if backend else {}
    done = subprocess.run(
        [sys.executable, "-c", PVE_DATA], cwd=REPO, env=env, check=True, capture_output=True, text=True
    )
    return {name: data["pve"] for name, data in json.loads(done.stdout).items()}


@pytest.fixture
def node() -> Iterator[hosts.LabHost]:
    name = f"h{os.getpid() % 10000}"
    yield pve_node.up(name, "reference")
    hosts.down(name)


def _client(node: hosts.LabHost, *, secret: str | None = None, fingerprint: str | None = None) -> PveClient:
    api = api_setup.record(node)
    assert api is not None
    token = Path(api["token_file"]).read_text().strip() if secret is None else secret
    return connect_https(
        node.address, TOKEN_ID, token, fingerprint=fingerprint or api["fingerprint"], timeout=30
    )


def test_https_token_creates_a_vm_and_is_refused_a_hookscript(node: hosts.LabHost) -> None:
    api = api_setup.record(node)
    assert api is not None
    assert (api["port"], api["token_id"]) == (8006, TOKEN_ID)
    assert stat.S_IMODE(Path(api["token_file"]).stat().st_mode) == 0o600
    client = _client(node)
    assert client.mappings() == ()

    upid = client.create_vm(node.name, 100, {"name": "tokenvm", "memory": 1024, "cores": 2})
    assert re.fullmatch(
        rf"UPID:{node.name}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:[0-9A-F]{{8}}:qmcreate:100:{TOKEN_ID}:", upid
    )
    assert client.wait_task(upid, 30).exitstatus == "OK"
    assert client.vm_config(node.name, 100).values["name"] == "tokenvm"

    with pytest.raises(PveError) as refused:
        client.create_vm(node.name, 101, {"name": "hooked", "hookscript": "local:snippets/pvegpu-hook.pl"})
    assert (refused.value.status, refused.value.message) == (500, "only root can set 'hookscript' config")
    assert not (node.root / "etc/pve/qemu-server/101.conf").exists()

    with pytest.raises(PveError) as unlock:
        client.unlock_vm(node.name, 100, client.vm_config(node.name, 100).digest)
    assert (unlock.value.status, unlock.value.errors) == (400, {"skiplock": "Only root may use this option."})

    writes = (node.root / "var/log/pvegpu-lab/api-writes.log").read_text()
    assert writes == f"{TOKEN_ID} POST /nodes/{node.name}/qemu cores,memory,name\n"


def test_https_wrong_fingerprint_is_refused(node: hosts.LabHost) -> None:
    wrong = ":".join(["AB"] * 32)
    with pytest.raises(PveConnectionError) as refused:
        _client(node, fingerprint=wrong).mappings()
    assert "Fingerprints did not match" in refused.value.message


def test_https_wrong_token_secret_is_refused(node: hosts.LabHost) -> None:
    with pytest.raises(PveError) as refused:
        _client(node, secret="00000000-0000-0000-0000-000000000000").mappings()
    assert (refused.value.status, refused.value.message) == (401, "Authentication failed!")
    log = (node.root / "var/log/pvegpu-lab/pveproxy.log").read_text()
    assert "authentication failure: invalid token value!" in log


def test_lab_inventory_pve_data_per_backend(node: hosts.LabHost) -> None:
    api = api_setup.record(node)
    assert api is not None
    assert _lab_pve_data("ssh") == {node.name: {"backend": "ssh"}}
    assert _lab_pve_data("local") == {node.name: {"backend": "local"}}
    assert _lab_pve_data(None) == _lab_pve_data("https")
    assert _lab_pve_data("https") == {
        node.name: {
            "backend": "https",
            "token_id": TOKEN_ID,
            "token_file": str(node.state_dir / "pve-token"),
            "fingerprint": api["fingerprint"],
        }
    }
