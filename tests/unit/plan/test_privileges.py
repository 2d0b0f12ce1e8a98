"""The doctor's check of the API token's privileges: the paths of this node it reads, what is missing, and
the report (pvegpu/plan/privileges.py; PveClient.permissions)."""

from __future__ import annotations

from typing import Any

from pvegpu.models.pve_privileges import PVE_PRIVILEGES, PvePrivilege
from pvegpu.models.specs import host_specs
from pvegpu.plan.privileges import (
    PrivilegeAt,
    acl_paths,
    missing_privileges,
    node_ids,
    privileges_report,
    required_privileges,
)
from pvegpu.pve.client import PveClient
from pvegpu.pve.transport import Method, Params

TOKEN = "pvegpu@pve!deploy"
IMAGE = {"url": "https://example.org/d.qcow2", "checksum": "0" * 128, "storage": "local"}
DATA: dict[str, Any] = {
    "node": {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}},
    "vm": {"vmid": 100, "image": IMAGE, "disk": {"storage": "local-lvm"}, "snippets_storage": "snip"},
}
SMALL = (
    PvePrivilege("VM.Config.CPU", "/vms/{vmid}", "set cores"),
    PvePrivilege("Mapping.Use", "/mapping/pci/{id}", "pass a mapped GPU"),
    PvePrivilege("Sys.Modify", "/", "download-url"),
)


def test_node_ids_from_the_specs_and_mappings() -> None:
    assert node_ids(host_specs(DATA), ("gpu0", "gpu1")) == {
        "vmid": ("100",),
        "storage": ("local-lvm", "snip", "local"),
        "id": ("gpu0", "gpu1"),
        "node": ("pve1",),
        "bridge": ("vmbr0",),
        "dirid": (),  # no `model` data
    }


def test_node_ids_name_the_model_stores_directory_mapping_with_vm_and_model_data() -> None:
    data = {**DATA, "model": {"source": {"dir": "/srv/models/glm"}}}
    assert node_ids(host_specs(data), ())["dirid"] == ("pvegpu-models",)


def test_required_privileges_per_path_of_this_node() -> None:
    ids = node_ids(host_specs(DATA), ("gpu0", "gpu1"))
    assert required_privileges(ids, SMALL) == (
        PrivilegeAt("VM.Config.CPU", "/vms/100", "set cores"),
        PrivilegeAt("Mapping.Use", "/mapping/pci/gpu0", "pass a mapped GPU"),
        PrivilegeAt("Mapping.Use", "/mapping/pci/gpu1", "pass a mapped GPU"),
        PrivilegeAt("Sys.Modify", "/", "download-url"),
    )
    assert required_privileges({**ids, "id": ()}, SMALL)[1:] == (
        PrivilegeAt("Sys.Modify", "/", "download-url"),
    )


def test_every_listed_privilege_is_checked_on_the_reference_node() -> None:
    required = required_privileges(node_ids(host_specs(DATA), ("gpu0",)))
    assert {p.name for p in required} == {p.name for p in PVE_PRIVILEGES}
    assert acl_paths(required) == (
        "/vms/100",
        "/storage/local-lvm",
        "/storage/snip",
        "/storage/local",
        "/mapping/pci/gpu0",
        "/sdn/zones/localnetwork/vmbr0",
        "/nodes/pve1",
        "/",
    )


def test_noop_all_held() -> None:
    required = required_privileges(node_ids(host_specs(DATA), ("gpu0",)), SMALL)
    granted = {
        "/vms/100": frozenset({"VM.Config.CPU", "VM.Audit"}),
        "/mapping/pci/gpu0": frozenset({"Mapping.Use"}),
        "/": frozenset({"Sys.Modify"}),
    }
    assert missing_privileges(required, granted) == ()
    assert privileges_report(TOKEN, required, ()) == (
        "API token pvegpu@pve!deploy: holds all 3 privileges pvegpu needs on 3 paths"
    )


def test_error_each_missing_privilege_named_with_its_path() -> None:
    required = required_privileges(node_ids(host_specs(DATA), ("gpu0", "gpu1")), SMALL)
    granted = {"/vms/100": frozenset({"VM.Config.CPU"}), "/mapping/pci/gpu0": frozenset({"Mapping.Use"})}
    missing = missing_privileges(required, granted)
    assert privileges_report(TOKEN, required, missing) == (
        "API token pvegpu@pve!deploy: lacks 2 of the 4 privileges pvegpu needs (README, Security: the pveum "
        "recipe grants them):\n"
        "  Mapping.Use on /mapping/pci/gpu1: pass a mapped GPU\n"
        "  Sys.Modify on /: download-url"
    )


def test_permissions_reads_one_path() -> None:
    """pve-access-control `permissions`: `{path: {privilege: propagate}}`; a path held nothing on: `{}`."""
    sent: list[tuple[Method, str, dict[str, object]]] = []
    answers: dict[str, object] = {
        "/vms/100": {"/vms/100": {"VM.Audit": 1, "VM.Config.CPU": 0}},
        "/nodes/pve1": {},
    }

    def transport(method: Method, path: str, params: Params) -> object:
        sent.append((method, path, dict(params)))
        return answers[str(params["path"])]

    api = PveClient(transport)
    assert api.permissions("/vms/100") == frozenset({"VM.Audit", "VM.Config.CPU"})
    assert api.permissions("/nodes/pve1") == frozenset()
    assert sent == [
        ("GET", "/access/permissions", {"path": "/vms/100"}),
        ("GET", "/access/permissions", {"path": "/nodes/pve1"}),
    ]
