"""With an API token and no root path to the node, each feature that writes a key only root@pam may set is
refused at inventory validation, before any host is touched (pvegpu/models/root_only_features.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pvegpu.inventory.validate import validate_inventory
from pvegpu.models.errors import InventoryError
from tests.unit.inventory_cli import doctor_with_inventory

NODE = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}
TOKEN_ONLY = {
    "backend": "https",
    "token_id": "pvegpu@pve!deploy",
    "token_file": "/etc/pvegpu/pve-token",
    "root_ssh": False,
}
# Every root-only feature off: what a token without a root path can deploy.
TOKEN_SAFE_VM = {"vmid": 100, "self_heal": "off", "mmio": "phys-bits"}
WAY = "let pvegpu reach the node as root over SSH (pve.root_ssh: true)"


def problems(vm: dict[str, Any], pve: dict[str, Any] = TOKEN_ONLY, **data: Any) -> list[str]:
    host = ("pve1.example.net", {"node": {**NODE, **data.pop("node", {})}, "pve": pve, "vm": vm, **data})
    try:
        validate_inventory([host])
    except InventoryError as error:
        return list(error.problems)
    return []


def test_error_default_self_heal_needs_the_hookscript() -> None:
    assert problems({"vmid": 100, "mmio": "phys-bits"}) == [
        "pve1.example.net: vm.self_heal: the API token pvegpu@pve!deploy cannot set 'hookscript' (Proxmox "
        f"allows it to root@pam only): set vm.self_heal: off, or {WAY}"
    ]


@pytest.mark.parametrize(
    ("update", "line"),
    [
        (
            {"self_heal": "check"},
            "vm.self_heal: {token} cannot set 'hookscript' {only}: set vm.self_heal: off",
        ),
        ({"mmio": "args"}, "vm.mmio: {token} cannot set 'args' {only}: set vm.mmio: phys-bits"),
        ({"p2p": "on"}, "vm.p2p: {token} cannot set 'args' {only}: set vm.p2p: off"),
        ({"p2p": "probe"}, "vm.p2p: {token} cannot set 'args' {only}: set vm.p2p: off"),
        (
            {"hugepages": "1024"},
            "vm.hugepages: {token} cannot set 'hugepages' {only}: leave vm.hugepages unset",
        ),
        (
            {"numa_layout": "host"},
            "vm.numa_layout: {token} cannot set 'affinity' {only}: set vm.numa_layout: flat",
        ),
        (
            {"host_reserved_cores": [0, 64]},
            "vm.host_reserved_cores: {token} cannot set 'affinity' {only}: "
            "leave vm.host_reserved_cores unset",
        ),
    ],
)
def test_error_each_root_only_feature(update: dict[str, Any], line: str) -> None:
    text = line.format(token="the API token pvegpu@pve!deploy", only="(Proxmox allows it to root@pam only)")
    assert problems({**TOKEN_SAFE_VM, **update}) == [f"pve1.example.net: {text}, or {WAY}"]


def test_error_every_feature_is_one_line() -> None:
    vm = {"vmid": 100, "p2p": "probe", "hugepages": "2"}
    assert [line.split(": the API token")[0] for line in problems(vm)] == [
        "pve1.example.net: vm.self_heal",
        "pve1.example.net: vm.mmio",
        "pve1.example.net: vm.p2p",
        "pve1.example.net: vm.hugepages",
    ]


def test_error_lxc_profile_needs_device_entries() -> None:
    lxc = {"vmid": 200, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"}
    assert problems(TOKEN_SAFE_VM, node={"profile": "lxc"}, lxc=lxc) == [
        "pve1.example.net: node.profile: the API token pvegpu@pve!deploy cannot set 'devN' (Proxmox allows "
        f"it to root@pam only): use node.profile vm or baremetal, or {WAY}"
    ]


def test_error_root_path_over_an_ssh_user_that_is_not_root_needs_sudo() -> None:
    """pvesh runs only as root: the root path over `deploy` needs pve.sudo, whatever the features."""
    pve = {**TOKEN_ONLY, "root_ssh": True}
    assert problems(TOKEN_SAFE_VM, pve, ssh_user="deploy") == [
        "pve1.example.net: pve.root_ssh: the keys only root@pam may set are written by root's pvesh over "
        "SSH, and the SSH user is deploy: set pve.sudo: true (or pve.ssh_user: root), or pve.root_ssh: false"
    ]
    assert problems(TOKEN_SAFE_VM, TOKEN_ONLY, ssh_user="deploy") == []  # no root path: nothing needs one
    assert problems({"vmid": 100}, {**pve, "sudo": True}, ssh_user="deploy") == []
    assert problems({"vmid": 100}, {**pve, "ssh_user": "root"}, ssh_user="deploy") == []


def test_create_token_with_root_ssh_takes_every_feature() -> None:
    vm = {"vmid": 100, "p2p": "probe", "hugepages": "2", "numa_layout": "host", "host_reserved_cores": [0]}
    assert problems(vm, {**TOKEN_ONLY, "root_ssh": True}, ssh_user="root") == []
    assert problems(vm, {**TOKEN_ONLY, "root_ssh": True}) == []  # no ssh_user: root, as pvegpu connects


def test_create_token_only_without_root_only_features() -> None:
    assert problems(TOKEN_SAFE_VM) == []


def test_create_other_profiles_write_no_vm_keys() -> None:
    """On `baremetal` the VM is only parked (stopped, `onboot` 0): no root-only key is written."""
    assert problems({"vmid": 100, "p2p": "on"}, node={"profile": "baremetal"}) == []


def test_create_pvesh_backends_run_as_root() -> None:
    vm = {"vmid": 100, "p2p": "on", "mmio": "args"}
    assert problems(vm, {"backend": "ssh"}) == []
    assert problems(vm, {"backend": "local"}) == []


def test_error_shipped_inventory_shape_without_root_ssh() -> None:
    """inventory.py's node (self_heal repair by default, mmio phys-bits) with root_ssh off."""
    vm = {"vmid": 100, "name": "llm", "cores": 64, "memory": 786432, "mmio": "phys-bits"}
    assert [line.split(": the API token")[0] for line in problems(vm)] == ["pve1.example.net: vm.self_heal"]


def test_error_pyinfra_stops_before_connecting(tmp_path: Path) -> None:
    """The real CLI on an inventory with a token and no root path: exit status 2, one line per feature, no
    connection (the host name cannot resolve: an attempt could not go unnoticed)."""
    host = "pve-nonexistent.invalid"
    data = {"node": NODE, "pve": TOKEN_ONLY, "vm": {"vmid": 100, "mmio": "args"}}
    result = doctor_with_inventory(
        tmp_path,
        "from pvegpu.inventory.validate import exit_on_invalid\n"
        f"pve_nodes = exit_on_invalid([({host!r}, {data!r})])\n",
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert "Connecting to hosts" not in result.stderr
    assert [line for line in result.stderr.splitlines() if not line.startswith("--> ")] == [
        f"{host}: vm.self_heal: the API token pvegpu@pve!deploy cannot set 'hookscript' (Proxmox allows it "
        f"to root@pam only): set vm.self_heal: off, or {WAY}",
        f"{host}: vm.mmio: the API token pvegpu@pve!deploy cannot set 'args' (Proxmox allows it to root@pam "
        f"only): set vm.mmio: phys-bits, or {WAY}",
    ]
