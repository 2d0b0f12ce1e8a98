"""pvegpu's own client on a lab node with the `https` backend and a root path (pvegpu.pve.host_client
`connect`,
pvegpu.pve `RootRouted`): what only root@pam may write goes through root's pvesh over the node's SSH, the
rest through the API token, and the stand-in's write log (`<user> <METHOD> <path> <keys>`) shows who set
what; the token alone is refused the same writes with Proxmox's text. The doctor names each privilege the
token lacks, read with `GET /access/permissions`."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import hosts
from lab.pve import api_setup
from lab.pve import node as pve_node
from pvegpu.models.pve_api import PveApiSpec
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.pve.host_client import connect

pytestmark = pytest.mark.lab

TOKEN_ID = "pvegpu@pve!deploy"
ARGS = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"


@pytest.fixture
def node() -> Iterator[hosts.LabHost]:
    name = f"h{os.getpid() % 10000}"
    yield pve_node.up(name, "reference")
    hosts.down(name)


def _client(node: hosts.LabHost, *, root_ssh: bool) -> PveClient:
    api = api_setup.record(node)
    assert api is not None
    spec = PveApiSpec(
        backend="https",
        token_id=TOKEN_ID,
        token_file=api["token_file"],
        fingerprint=api["fingerprint"],
        root_ssh=root_ssh,
    )
    data = {
        "ssh_hostname": node.address,
        "ssh_user": "root",
        "ssh_key": str(node.key),
        "ssh_known_hosts_file": str(hosts.known_hosts_path()),
    }
    return connect(spec, data, node.name)


def test_root_only_keys_go_through_root_the_rest_through_the_token(node: hosts.LabHost) -> None:
    client = _client(node, root_ssh=True)
    upid = client.create_vm(node.name, 100, {"name": "routed", "memory": 1024, "cores": 2, "args": ARGS})
    assert re.fullmatch(rf"UPID:{node.name}:[0-9A-F:]+:qmcreate:100:root@pam:", upid)
    assert client.wait_task(upid, 30).exitstatus == "OK"  # root's task, read with the token (Sys.Audit)

    config = client.vm_config(node.name, 100)
    assert config.values["args"] == ARGS
    client.update_vm_config(node.name, 100, {"cores": "4"}, config.digest)
    client.update_vm_config(node.name, 100, {}, client.vm_config(node.name, 100).digest, delete=["args"])
    client.unlock_vm(node.name, 100, client.vm_config(node.name, 100).digest)

    writes = (node.root / "var/log/pvegpu-lab/api-writes.log").read_text().splitlines()
    assert writes == [
        f"root@pam POST /nodes/{node.name}/qemu args,cores,memory,name",
        f"{TOKEN_ID} PUT /nodes/{node.name}/qemu/100/config cores",
        f"root@pam PUT /nodes/{node.name}/qemu/100/config -args",
        f"root@pam PUT /nodes/{node.name}/qemu/100/config -lock",
    ]


def test_error_the_token_alone_is_refused_root_only_keys(node: hosts.LabHost) -> None:
    client = _client(node, root_ssh=False)
    with pytest.raises(PveError) as refused:
        client.create_vm(node.name, 100, {"name": "token", "memory": 1024, "cores": 2, "args": ARGS})
    assert (refused.value.status, refused.value.message) == (500, "only root can set 'args' config")
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()


def test_doctor_names_each_privilege_the_token_lacks(
    node: hosts.LabHost,
    pyinfra_cli: Callable[..., subprocess.CompletedProcess[str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("PVEGPU_LAB_PVE_BACKEND", "https")
    monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(tmp_path))
    doctor = ("-y", "--limit", node.name, "inventory/lab.py", "deploy/doctor.py")

    held = pyinfra_cli(*doctor).stderr
    assert (
        f"[{node.name}] keys only root@pam may set are written by root's pvesh over SSH (pve.root_ssh)"
        in held
    )
    # 14 on /vms/100, 4 on each of 2 storages, 3 on each of 8 mappings, SDN.Use, Sys.Audit on the node and on
    # /, Sys.Modify (a netns node has no model store: inventory/lab.py).
    assert f"[{node.name}] API token {TOKEN_ID}: holds all 50 privileges pvegpu needs on 14 paths" in held

    user_cfg = node.root / "etc/pve/user.cfg"
    user_cfg.write_text(user_cfg.read_text().replace(",VM.Config.Cloudinit,", ","))
    lacking = pyinfra_cli(*doctor).stderr
    assert (
        f"[{node.name}] API token {TOKEN_ID}: lacks 1 of the 50 privileges pvegpu needs (README, Security: "
        "the pveum recipe grants them):\n"
        "  VM.Config.Cloudinit on /vms/100: set ciuser, sshkeys, ipconfig0 and cicustom"
    ) in lacking
