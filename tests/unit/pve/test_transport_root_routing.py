"""Which identity sends each API call: the token, or root's pvesh on the node for what only root@pam may
send (pvegpu/models/pve_root_only.py, pvegpu.pve `RootRouted`, pvegpu.pve.host_client `connect`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pvegpu.models.pve_api import PveApiSpec
from pvegpu.models.pve_root_only import ct_root_only_keys, root_only_params, vm_root_only_keys
from pvegpu.pve.client import PveClient
from pvegpu.pve.host_client import FirstCall, connect, shared_reads
from pvegpu.pve.https import HttpsTransport
from pvegpu.pve.transport import CommandTransport, Method, Params, RootRouted, acts_as

TOKEN = "pvegpu@pve!deploy"
CONFIG = "/nodes/pve1/qemu/100/config"
UPID = "UPID:pve1:0000A1B3:0153F2C4:66A1B2C4:qmcreate:100:root@pam:"
DIGEST = "0123456789abcdef0123456789abcdef01234567"

# Qemu.pm $check_vm_modify_config_perm: the keys outside every allowed list that pvegpu writes or could.
ROOT_ONLY_VM_KEYS = ("affinity", "args", "hookscript", "hugepages", "keephugepages", "lock", "vmgenid")


class Recorder:
    """A transport that records the calls it is sent and answers `answer`."""

    def __init__(self, answer: object = None) -> None:
        self.calls: list[tuple[Method, str, dict[str, Any]]] = []
        self.answer = answer

    def __call__(self, method: Method, path: str, params: Params) -> object:
        self.calls.append((method, path, {k: v for k, v in params.items() if v is not None}))
        return self.answer


def routed(answer: object = None) -> tuple[PveClient, Recorder, Recorder, list[int]]:
    token, root, opened = Recorder(answer), Recorder(answer), []

    def open_root() -> Recorder:
        opened.append(1)
        return root

    return PveClient(RootRouted(token, TOKEN, open_root)), token, root, opened


@pytest.mark.parametrize("key", ROOT_ONLY_VM_KEYS)
def test_root_only_vm_key_set_or_deleted(key: str) -> None:
    assert vm_root_only_keys({key: "1"}) == (key,)
    assert vm_root_only_keys({}, [key]) == (key,)
    assert root_only_params("POST", "/nodes/pve1/qemu", {"vmid": 100, key: "1"}) == (key,)
    assert root_only_params("PUT", CONFIG, {key: "1", "digest": DIGEST}) == (key,)
    assert root_only_params("PUT", CONFIG, {"delete": f"cores,{key}", "digest": DIGEST}) == (key,)
    assert root_only_params("POST", CONFIG, {key: "1"}) == (key,)  # the async config update


def test_keys_any_identity_may_set_with_its_privileges() -> None:
    """What pvegpu's create sends besides hookscript/args/hugepages/affinity (plan/vm.py), and the call
    parameters that are not config keys."""
    config = {
        "vmid": 100, "name": "llm", "machine": "q35", "bios": "ovmf", "ostype": "l26",
        "cpu": "host,phys-bits=48", "sockets": "2", "cores": "16", "memory": "262144", "numa": "1",
        "numa0": "cpus=0-15,hostnodes=0,memory=131072,policy=bind", "balloon": "0", "agent": "1",
        "onboot": "1", "scsihw": "virtio-scsi-single", "hostpci0": "mapping=gpu0,pcie=1",
        "hostpci1": "mapping=gpu1,pcie=1", "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=0",
        "scsi0": "local-lvm:0,import-from=local:import/debian-12.qcow2,iothread=1", "boot": "order=scsi0",
        "ide2": "local-lvm:cloudinit", "ipconfig0": "ip=dhcp", "ciupgrade": "0",
        "cicustom": "user=local:snippets/pvegpu-100-user.yaml", "net0": "virtio,bridge=vmbr0",
        "serial0": "socket", "tags": "pvegpu", "description": "x", "start": True, "storage": "local-lvm",
    }  # fmt: skip
    assert root_only_params("POST", "/nodes/pve1/qemu", config) == ()
    assert root_only_params("PUT", CONFIG, {"delete": "numa1,hostpci7,unused0", "digest": DIGEST}) == ()
    assert root_only_params("GET", CONFIG, {}) == ()


@pytest.mark.parametrize(
    ("key", "value", "root"),
    [
        ("hostpci0", "0000:41:00,pcie=1", True),  # raw passthrough: for non-mapped devices
        ("hostpci0", "host=0000:41:00.0,pcie=1", True),
        ("hostpci0", "mapping=gpu0,pcie=1,romfile=vbios.bin", True),
        ("hostpci0", "mapping=gpu0,pcie=1", False),
        ("usb0", "host=1234:5678", True),
        ("usb0", "spice", False),
        ("usb0", "mapping=key", False),
        ("serial0", "/dev/ttyS0", True),
        ("serial0", "socket", False),
    ],
)
def test_value_dependent_keys(key: str, value: str, root: bool) -> None:
    assert vm_root_only_keys({key: value}) == ((key,) if root else ())


def test_skiplock_and_unlock_are_root_only() -> None:
    unlock = {"delete": "lock", "skiplock": True, "digest": DIGEST}
    assert root_only_params("PUT", CONFIG, unlock) == ("skiplock", "lock")
    assert root_only_params("POST", "/nodes/pve1/qemu/100/status/start", {"skiplock": 1}) == ("skiplock",)
    assert root_only_params("POST", "/nodes/pve1/qemu/100/status/start", {"skiplock": False}) == ()


def test_container_keys() -> None:
    """pve-container LXC.pm check_ct_modify_config_perm: device passthrough, hookscript, features."""
    assert ct_root_only_keys({"dev0": "/dev/nvidia0,gid=44", "cores": "8"}) == ("dev0",)
    assert ct_root_only_keys({}, ["dev3"]) == ("dev3",)
    create = {"vmid": 200, "ostemplate": "local:vztmpl/d.tar.zst", "dev0": "/dev/nvidia0,gid=44"}
    assert root_only_params("POST", "/nodes/pve1/lxc", create) == ("dev0",)
    assert root_only_params("PUT", "/nodes/pve1/lxc/200/config", {"hookscript": "local:snippets/h"}) == (
        "hookscript",
    )
    assert root_only_params("PUT", "/nodes/pve1/lxc/200/config", {"memory": "4096", "onboot": "1"}) == ()


def test_create_with_a_hookscript_goes_through_root() -> None:
    api, token, root, opened = routed(UPID)
    config = {"name": "llm", "hookscript": "local:snippets/pvegpu-hook", "hostpci0": "mapping=gpu0,pcie=1"}
    assert api.acts_as("POST", "/nodes/pve1/qemu", {"vmid": 100, **config}) == "root@pam"
    assert api.create_vm("pve1", 100, config) == UPID
    assert root.calls == [("POST", "/nodes/pve1/qemu", {"vmid": 100, **config})]
    assert token.calls == []
    assert opened == [1]


def test_create_without_root_only_keys_goes_through_the_token() -> None:
    api, token, root, opened = routed(UPID)
    config = {"name": "llm", "cpu": "host", "hostpci0": "mapping=gpu0,pcie=1"}
    assert api.acts_as("POST", "/nodes/pve1/qemu", {"vmid": 100, **config}) == TOKEN
    assert api.create_vm("pve1", 100, config) == UPID
    assert token.calls == [("POST", "/nodes/pve1/qemu", {"vmid": 100, **config})]
    assert (root.calls, opened) == ([], [])  # never connected


@pytest.mark.parametrize("key", ROOT_ONLY_VM_KEYS)
def test_update_and_delete_of_a_root_only_key_go_through_root_with_the_digest(key: str) -> None:
    api, token, root, opened = routed()
    api.update_vm_config("pve1", 100, {key: "1", "cores": "8"}, DIGEST)
    api.update_vm_config("pve1", 100, {"cores": "8"}, DIGEST, delete=[key])
    assert root.calls == [
        ("PUT", CONFIG, {key: "1", "cores": "8", "digest": DIGEST}),
        ("PUT", CONFIG, {"cores": "8", "delete": key, "digest": DIGEST}),
    ]
    assert token.calls == []
    assert opened == [1]  # one root connection for the run


def test_update_of_other_keys_and_every_read_go_through_the_token() -> None:
    api, token, root, _ = routed()
    api.update_vm_config("pve1", 100, {"cores": "8", "hostpci0": "mapping=gpu0,pcie=1"}, DIGEST)
    token.answer = {"digest": DIGEST, "hookscript": "local:snippets/pvegpu-hook"}
    api.vm_config("pve1", 100)
    assert token.calls == [
        ("PUT", CONFIG, {"cores": "8", "hostpci0": "mapping=gpu0,pcie=1", "digest": DIGEST}),
        ("GET", CONFIG, {}),
    ]
    assert root.calls == []


def test_unlock_goes_through_root() -> None:
    api, token, root, _ = routed()
    api.unlock_vm("pve1", 100, DIGEST)
    assert root.calls == [("PUT", CONFIG, {"delete": "lock", "skiplock": True, "digest": DIGEST})]
    assert token.calls == []


def test_raw_host_passthrough_goes_through_root() -> None:
    api, token, root, _ = routed()
    api.update_vm_config("pve1", 100, {"hostpci0": "0000:41:00,pcie=1"}, DIGEST)
    assert [call[0] for call in root.calls] == ["PUT"]
    assert token.calls == []


def test_container_devices_go_through_root() -> None:
    api, token, root, _ = routed()
    api.update_lxc_config("pve1", 200, {"dev0": "/dev/nvidia0,gid=44"}, DIGEST)
    api.update_lxc_config("pve1", 200, {"memory": "4096"}, DIGEST)
    assert root.calls == [
        ("PUT", "/nodes/pve1/lxc/200/config", {"dev0": "/dev/nvidia0,gid=44", "digest": DIGEST})
    ]
    assert token.calls == [("PUT", "/nodes/pve1/lxc/200/config", {"memory": "4096", "digest": DIGEST})]


def test_identity_of_the_plain_backends() -> None:
    params: Params = {"hookscript": "local:snippets/pvegpu-hook"}
    assert acts_as(CommandTransport(lambda _argv: ("", "", 0)), "PUT", CONFIG, params) == "root@pam"
    assert acts_as(HttpsTransport(object(), TOKEN), "PUT", CONFIG, params) == TOKEN
    assert acts_as(Recorder(), "PUT", CONFIG, params) == "root@pam"  # a bare transport: pvesh's


def test_shared_reads_keep_the_identity_and_a_root_write_drops_the_shared_answers() -> None:
    api, token, root, _ = routed()
    shared = shared_reads(api)
    token.answer = {"digest": DIGEST}
    shared.vm_config("pve1", 100)
    shared.vm_config("pve1", 100)
    shared.update_vm_config("pve1", 100, {"args": "-cpu host"}, DIGEST)
    shared.vm_config("pve1", 100)
    assert [call[0] for call in token.calls] == ["GET", "GET"]  # read once, again after the write
    assert [call[0] for call in root.calls] == ["PUT"]
    assert shared.acts_as("PUT", CONFIG, {"args": "-cpu host"}) == "root@pam"
    assert shared.acts_as("PUT", CONFIG, {"cores": "8"}) == TOKEN


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "pve-token"
    path.write_text("00000000-0000-0000-0000-000000000000\n")
    os.chmod(path, 0o600)
    return str(path)


def test_connect_https_routes_root_only_keys_over_the_hosts_ssh(token_file: str) -> None:
    spec = PveApiSpec(backend="https", token_id=TOKEN, token_file=token_file, port=8006)
    client = connect(spec, {"ssh_hostname": "192.0.2.10", "ssh_user": "root"})
    assert isinstance(client.call, RootRouted)
    assert isinstance(client.call.token, FirstCall)
    assert client.call.token_id == client.call.token.identity == TOKEN
    assert client.acts_as("PUT", CONFIG, {"hookscript": "local:snippets/pvegpu-hook"}) == "root@pam"
    assert client.call.token._made is None  # nothing of the https backend is built before a call
    assert isinstance(client.call.token.make(), HttpsTransport)


def test_connect_https_without_root_ssh_is_the_token_alone(token_file: str) -> None:
    spec = PveApiSpec(backend="https", token_id=TOKEN, token_file=token_file, root_ssh=False)
    client = connect(spec, {"ssh_hostname": "192.0.2.10"})
    assert isinstance(client.call, FirstCall)
    assert isinstance(client.call.make(), HttpsTransport)
    assert client.acts_as("PUT", CONFIG, {"hookscript": "local:snippets/pvegpu-hook"}) == TOKEN


def test_root_user_of_each_backend(token_file: str) -> None:
    assert PveApiSpec().root_user == "root@pam"
    assert PveApiSpec(backend="local").root_user == "root@pam"
    https = PveApiSpec(backend="https", token_id=TOKEN, token_file=token_file)
    assert (https.api_user, https.root_user) == (TOKEN, "root@pam")
    assert https.model_copy(update={"root_ssh": False}).root_user is None


def test_connect_takes_the_pyinfra_host_name_without_ssh_hostname(token_file: str) -> None:
    """inventory.py names its node by address (`pve1.example.net`) and sets no ssh_hostname: the API and
    root's SSH go where pyinfra's SSH connector goes, the host's name."""
    spec = PveApiSpec(backend="https", token_id=TOKEN, token_file=token_file)
    client = connect(spec, {"ssh_user": "root"}, "pve1.example.net")
    assert isinstance(client.call, RootRouted)
    assert isinstance(client.call.token, FirstCall)
    https = client.call.token.make()
    assert https.api._store["base_url"] == "https://pve1.example.net:8006/api2/json"  # type: ignore[attr-defined]
