"""A VM's `virtiofsN` in the stand-in: the key's format (guest_schema, formats.VIRTIOFS_FMT), its permission
check on create, update and delete (permissions.check_dir_perm), and a start's checks of the mapping on this
node and what the lab hypervisor is handed (mapping_dir.virtiofs_dirs).

Expected texts were read in Proxmox's source: qemu-server 9.2.6 src/PVE/QemuServer/Virtiofs.pm ($virtiofs_fmt,
assert_virtiofs_config), src/PVE/API2/Qemu.pm (check_dir_perm, check_vm_create_dir_perm, update_vm's
virtiofsN branches), pve-guest-common 6.0.2 src/PVE/Mapping/Dir.pm (find_on_current_node, assert_valid)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.pve import access, api_setup
from lab.pve.pvelib.errors import ParamError
from lab.pve.pvelib.guest_schema import qemu_extra
from lab.pve.pvelib.settings import Settings
from tests.unit.lab.pve.test_access import TOKEN, Node
from tests.unit.lab.pve.test_pvesh_cloudimage import Hypervisor

STORE = "/var/lib/pvegpu/models"
MAPPING = f"models\n\tmap node=pve1,path={STORE}\n\n"
CONFIG = "/nodes/pve1/qemu/100/config"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Node, Hypervisor]]:
    hv = Hypervisor(tmp_path / "hv", lambda _request: {"ok": True, "pid": 4242, "guest": None})
    hv.folder.mkdir()
    settings = Settings("pve1", tmp_path / "sys", tmp_path / "root", hv.folder, 20.0, "9.2.11", "9.2")
    api_setup.write_access(settings.root, "s3cret")
    (settings.root / STORE.lstrip("/")).mkdir(parents=True)
    (settings.root / "etc/pve/mapping").mkdir(parents=True)
    thread = threading.Thread(target=hv.serve, daemon=True)
    thread.start()
    yield Node(settings), hv
    hv.stop.set()
    thread.join()


def _mapping(node: Node, text: str) -> None:
    (node.root / "etc/pve/mapping/directory.cfg").write_text(text)


def test_virtiofs_keys_are_virtiofs0_to_virtiofs9() -> None:
    assert [qemu_extra(f"virtiofs{i}") is not None for i in (0, 9, 10)] == [True, True, False]


# A virtiofs0 value -> the 400's errors (pve-common JSONSchema check_prop's texts for $virtiofs_fmt).
FORMAT_ERRORS = {
    "cache=auto": {"virtiofs0.dirid": "property is missing and it is not optional"},
    "models,cache=fast": {
        "virtiofs0.cache": "value 'fast' does not have a value in the enumeration"
        " 'auto, always, metadata, never'"
    },
    "Bad.Id": {"virtiofs0.dirid": "invalid format - invalid configuration ID 'Bad.Id'"},
    "models,direct-io=maybe": {"virtiofs0.direct-io": "type check ('boolean') failed - got 'maybe'"},
}


@pytest.mark.parametrize(("value", "errors"), FORMAT_ERRORS.items())
def test_error_virtiofs_value_of_another_format(
    api: tuple[Node, Hypervisor], value: str, errors: dict[str, str]
) -> None:
    node, _ = api
    with pytest.raises(ParamError) as refused:
        node.call("root@pam", "create", "/nodes/pve1/qemu", vmid="100", virtiofs0=value)
    assert refused.value.errors == errors


def test_error_token_needs_vm_config_disk_then_mapping_use(api: tuple[Node, Hypervisor]) -> None:
    node, _ = api
    cfg = node.root / "etc/pve/user.cfg"
    refusals = []
    for privilege in ("VM.Config.Disk,", "Mapping.Use,"):
        cfg.write_text(api_setup.user_cfg().replace(privilege, ""))
        with pytest.raises(access.PermissionDenied) as refused:
            node.call(TOKEN, "create", "/nodes/pve1/qemu", vmid="100", virtiofs0="models,cache=always")
        refusals.append((refused.value.code, refused.value.text))
    assert refusals == [
        (403, "Permission check failed (/vms/100, VM.Config.Disk)\n"),
        (403, "Permission check failed (/mapping/dir/models, Mapping.Use)\n"),
    ]
    assert not (node.root / "etc/pve/qemu-server/100.conf").exists()


def test_error_token_replacing_or_deleting_needs_mapping_use_on_the_old_value(
    api: tuple[Node, Hypervisor],
) -> None:
    node, _ = api
    node.conf(100, "name: vm\nvirtiofs0: models\n")
    cfg = node.root / "etc/pve/user.cfg"
    cfg.write_text(api_setup.user_cfg() + f"acl:1:/mapping/dir/models:{TOKEN}:NoAccess:\n")
    texts = []
    for params in ({"virtiofs0": "other"}, {"delete": "virtiofs0"}):
        with pytest.raises(access.PermissionDenied) as refused:
            node.call(TOKEN, "set", CONFIG, **params)
        texts.append(refused.value.text)
    assert texts == ["Permission check failed (/mapping/dir/models, Mapping.Use)\n"] * 2

    node.call(TOKEN, "set", CONFIG, virtiofs1="other,expose-xattr=1")
    node.call("root@pam", "set", CONFIG, delete="virtiofs0")
    assert (node.root / "etc/pve/qemu-server/100.conf").read_text() == (
        "name: vm\nvirtiofs1: other,expose-xattr=1\n"
    )


def _start(node: Node) -> tuple[str, str]:
    """The start task's exit status and log."""
    upid = node.call("root@pam", "create", "/nodes/pve1/qemu/100/status/start")
    status: dict[str, Any] = node.call("root@pam", "get", f"/nodes/pve1/tasks/{upid}/status")
    log = node.call("root@pam", "get", f"/nodes/pve1/tasks/{upid}/log", limit="50")
    return status["exitstatus"], "".join(f"{line['t']}\n" for line in log)


@pytest.mark.parametrize(
    ("mapping", "conf", "text"),
    [
        pytest.param("", "virtiofs0: models\n", "Directory ID models does not exist.\n", id="no-mapping"),
        pytest.param(
            "models\n\tmap node=pve2,path=/srv\n\n",
            "virtiofs0: models\n",
            "No directory mapping for node pve1.\n",
        ),
        pytest.param(
            f"models\n\tmap node=pve1,path={STORE}\n\tmap node=pve1,path=/srv\n\n",
            "virtiofs0: models\n",
            "More than than one directory mapping for node pve1.\n",
            id="node-twice",
        ),
        pytest.param(
            "models\n\tmap node=pve1,path=/srv/gone\n\n",
            "virtiofs0: models\n",
            "directory mapping invalid: Path /srv/gone does not exist\n\n",  # upstream's `die "...: $@\n"`
            id="gone",
        ),
        pytest.param(
            MAPPING,
            "ostype: win11\nvirtiofs0: models,expose-acl=1\n",
            "Please disable ACLs for virtiofs on Windows VMs, otherwise"
            " the virtiofs shared directory cannot be mounted.\n",
            id="windows-acl",
        ),
    ],
)
def test_error_start_checks_the_mapping_on_this_node(
    api: tuple[Node, Hypervisor], mapping: str, conf: str, text: str
) -> None:
    node, hv = api
    _mapping(node, mapping)
    node.conf(100, f"memory: 2048\n{conf}")

    exitstatus, log = _start(node)

    status = text.removesuffix("\n").replace("\n", " ")  # fork_worker: one chomp, other newlines spaces
    assert (exitstatus, log) == (status, f"\nTASK ERROR: {status}\n")
    assert hv.requests == []


def test_start_hands_the_hypervisor_each_share_of_this_node(api: tuple[Node, Hypervisor]) -> None:
    node, hv = api
    _mapping(node, f"{MAPPING}cache\n\tmap node=pve1,path=/var/lib\n\n")
    node.conf(100, "memory: 2048\nvirtiofs0: models,cache=always\nvirtiofs3: dirid=cache\n")

    assert _start(node) == ("OK", "TASK OK\n")

    (request,) = hv.requests
    assert request["virtiofs"] == [
        {"index": 0, "dirid": "models", "path": STORE},
        {"index": 3, "dirid": "cache", "path": "/var/lib"},
    ]
