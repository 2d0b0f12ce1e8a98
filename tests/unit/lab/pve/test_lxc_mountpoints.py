"""A container's `mpN` in the stand-in: pve-container's mount point format (formats.MP_FMT), a host
directory's bind mount root@pam's only (ct_permissions.check_ct_modify_config_perm), a start whose bind
mount's directory is gone (nodes_lxc._check_bind_mounts), and the bind mounts a start hands the lab
hypervisor (nodes_lxc.mp_entries).

Expected texts were read in Proxmox's source: pve-container 6.1.10 src/PVE/LXC/Config.pm ($mp_desc,
verify_lxc_mp_string, classify_mountpoint), src/PVE/LXC.pm (check_ct_modify_config_perm's `mount point type
<type> is only allowed for root@pam`, mount_volume's `directory '<dir>' does not exist`, vm_start's
run_command of `systemctl start pve-container@<vmid>`), pve-common 9.2.1 JSONSchema.pm
(pve_verify_disk_size)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.pve import access, api_setup
from lab.pve.pvelib.api.nodes_lxc import mp_entries
from lab.pve.pvelib.errors import ParamError
from lab.pve.pvelib.settings import Settings
from tests.unit.lab.pve.test_access import TOKEN, Node
from tests.unit.lab.pve.test_pvesh_cloudimage import Hypervisor

TEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
STORE = "/var/lib/pvegpu/models"
BIND = f"{STORE},mp=/models,ro=1"
CONFIG = "/nodes/pve1/lxc/200/config"


@pytest.fixture
def api(tmp_path: Path) -> Node:
    settings = Settings("pve1", tmp_path / "sys", tmp_path / "root", None, 1.0, "9.2.11", "9.2")
    api_setup.write_access(settings.root, "s3cret")
    return Node(settings)


def _ct(node: Node, text: str) -> Path:
    path = node.root / "etc/pve/lxc/200.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_root_sets_a_read_only_bind_mount(api: Node) -> None:
    path = _ct(api, "hostname: llm\nunprivileged: 1\n")

    api.call("root@pam", "set", CONFIG, mp0=BIND)

    assert path.read_text() == f"hostname: llm\nmp0: {BIND}\nunprivileged: 1\n"
    assert api.call("root@pam", "get", CONFIG)["mp0"] == BIND


@pytest.mark.parametrize(
    ("value", "kind"),
    [(BIND, "bind"), ("/dev/sdb1,mp=/data", "device"), (f"volume={STORE},mp=/models", "bind")],
)
def test_error_token_mount_point_of_no_volume_is_root_only(api: Node, value: str, kind: str) -> None:
    path = _ct(api, "hostname: llm\nunprivileged: 1\n")
    refused: list[tuple[int, str]] = []
    with pytest.raises(access.PermissionDenied) as update:
        api.call(TOKEN, "set", CONFIG, mp0=value)
    refused.append((update.value.code, update.value.text))
    with pytest.raises(access.PermissionDenied) as create:
        api.call(TOKEN, "create", "/nodes/pve1/lxc", vmid="201", ostemplate=TEMPLATE, mp0=value)
    refused.append((create.value.code, create.value.text))

    text = f"Permission check failed (mount point type {kind} is only allowed for root@pam)\n"
    assert refused == [(403, text), (403, text)]
    assert path.read_text() == "hostname: llm\nunprivileged: 1\n"
    assert not (api.root / "etc/pve/lxc/201.conf").exists()


@pytest.mark.parametrize(
    ("value", "errors"),
    [
        pytest.param(STORE, {"mp0.mp": "property is missing and it is not optional"}, id="no-mp"),
        pytest.param(
            "/srv/../etc,mp=/x",
            {"mp0.volume": "invalid format - /srv/../etc contains illegal character sequences"},
            id="dotdot",
        ),
        pytest.param(
            f"{BIND},ro=maybe", {"mp0": "invalid format - duplicate key in comma-separated list property: ro"}
        ),
        pytest.param(
            f"{STORE},mp=/m,ro=maybe", {"mp0.ro": "type check ('boolean') failed - got 'maybe'"}, id="ro"
        ),
        pytest.param(
            f"{STORE},mp=/m,size=big",
            {"mp0.size": "invalid format - value does not look like a valid disk size: big"},
            id="size",
        ),
        pytest.param(
            f"{STORE},mp=/m,mountoptions=noatime;sync",
            {"mp0.mountoptions": "value does not match the regex pattern"},
            id="mountoptions",
        ),
    ],
)
def test_error_mount_point_of_another_format(api: Node, value: str, errors: dict[str, str]) -> None:
    _ct(api, "hostname: llm\n")
    with pytest.raises(ParamError) as refused:
        api.call("root@pam", "set", CONFIG, mp0=value)
    assert refused.value.errors == errors


def test_error_start_with_the_bind_mounts_directory_gone(api: Node, capsys: Any) -> None:
    _ct(api, f"hostname: llm\nmp0: /srv/data,mp=/data\nmp1: {BIND}\n")
    (api.root / "srv/data").mkdir(parents=True)

    upid = api.call("root@pam", "create", "/nodes/pve1/lxc/200/status/start")

    status = api.call("root@pam", "get", f"/nodes/pve1/tasks/{upid}/status")
    assert status["exitstatus"] == "command 'systemctl start pve-container@200' failed: exit code 1"
    assert (api.root / "run/pve/ct-200.stderr").read_text() == f"directory '{STORE}' does not exist\n"
    capsys.readouterr()


# A CT config's mpN -> the lab hypervisor's `mp` entries (nodes_lxc.mp_entries): bind mounts only (a node
# directory; LXC/Config.pm classify_mountpoint), in index order, `ro` a boolean.
MP_ENTRIES = {
    "bind-ro": (
        {"mp0": BIND},
        [{"key": "mp0", "source": STORE, "target": "/models", "ro": True}],
    ),
    "bind-rw-explicit-keys": (
        {"mp1": "volume=/srv/data,mp=/srv/x,ro=0,backup=0"},
        [{"key": "mp1", "source": "/srv/data", "target": "/srv/x", "ro": False}],
    ),
    "index-order-storage-and-device-left-out": (
        {
            "mp10": "/srv/ten,mp=/ten,ro=yes",
            "mp2": "/srv/two,mp=/two",
            "mp3": "local-lvm:vm-200-disk-1,mp=/data,size=8G",
            "mp4": "/dev/sdb1,mp=/dev-disk",
            "rootfs": "local-lvm:vm-200-disk-0,size=8G",
        },
        [
            {"key": "mp2", "source": "/srv/two", "target": "/two", "ro": False},
            {"key": "mp10", "source": "/srv/ten", "target": "/ten", "ro": True},
        ],
    ),
    "none": ({"hostname": "llm"}, []),
}


@pytest.mark.parametrize(("conf", "entries"), MP_ENTRIES.values(), ids=MP_ENTRIES.keys())
def test_mp_entries_are_the_bind_mount_points_in_index_order(
    conf: dict[str, str], entries: list[dict[str, Any]]
) -> None:
    assert mp_entries(conf) == entries


@pytest.fixture
def hv_api(tmp_path: Path) -> Iterator[tuple[Node, Hypervisor]]:
    hv = Hypervisor(tmp_path / "hv", lambda _request: {"ok": True, "pid": 4242, "guest": "pve1c200"})
    hv.folder.mkdir()
    settings = Settings("pve1", tmp_path / "sys", tmp_path / "root", hv.folder, 20.0, "9.2.11", "9.2")
    api_setup.write_access(settings.root, "s3cret")
    thread = threading.Thread(target=hv.serve, daemon=True)
    thread.start()
    yield Node(settings), hv
    hv.stop.set()
    thread.join()


def test_start_hands_the_hypervisor_the_bind_mounts(hv_api: tuple[Node, Hypervisor]) -> None:
    node, hv = hv_api
    _ct(node, f"hostname: llm\nmp0: {BIND}\nmp1: /srv/data,mp=/srv/x\nmp2: local-lvm:vm-200-disk-1,mp=/d\n")
    (node.root / STORE.lstrip("/")).mkdir(parents=True)
    (node.root / "srv/data").mkdir(parents=True)

    upid = node.call("root@pam", "create", "/nodes/pve1/lxc/200/status/start")

    assert node.call("root@pam", "get", f"/nodes/pve1/tasks/{upid}/status")["exitstatus"] == "OK"
    assert hv.requests == [
        {
            "action": "start",
            "type": "lxc",
            "vmid": 200,
            "dev": [],
            "mp": [
                {"key": "mp0", "source": STORE, "target": "/models", "ro": True},
                {"key": "mp1", "source": "/srv/data", "target": "/srv/x", "ro": False},
            ],
        }
    ]
