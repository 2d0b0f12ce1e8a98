"""A container's `mpN` in the stand-in: pve-container's mount point format (formats.MP_FMT), a host
directory's bind mount root@pam's only (ct_permissions.check_ct_modify_config_perm), and a start whose bind
mount's directory is gone (nodes_lxc._check_bind_mounts).

Expected texts were read in Proxmox's source: pve-container 6.1.10 src/PVE/LXC/Config.pm ($mp_desc,
verify_lxc_mp_string, classify_mountpoint), src/PVE/LXC.pm (check_ct_modify_config_perm's `mount point type
<type> is only allowed for root@pam`, mount_volume's `directory '<dir>' does not exist`, vm_start's
run_command of `systemctl start pve-container@<vmid>`), pve-common 9.2.1 JSONSchema.pm
(pve_verify_disk_size)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.pve import access, api_setup
from lab.pve.pvelib.errors import ParamError
from lab.pve.pvelib.settings import Settings
from tests.unit.lab.pve.test_access import TOKEN, Node

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
