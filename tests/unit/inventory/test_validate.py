"""Inventory specs: valid data normalised, every bad input reported with its exact operator-facing line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from pydantic import BaseModel, ConfigDict, Field
from pyinfra.api.host import HostData

from pvegpu.inventory.tables import spec_table_markdown
from pvegpu.inventory.validate import ROLE_SPECS, exit_on_invalid, validate_inventory
from pvegpu.models.errors import InventoryError
from pvegpu.models.node import GpuSelector, NodeSpec
from pvegpu.models.spec_validation import spec_of

REPO = Path(__file__).resolve().parents[3]
GOOD = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"], "count": 8}}


def node(**changes: object) -> dict[str, object]:
    return {"node": {**GOOD, **changes}}


def problems(hosts: list[str | tuple[str, object]]) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        validate_inventory(hosts)
    assert str(caught.value) == "\n".join(caught.value.problems)
    return list(caught.value.problems)


def test_valid_node_gets_defaults() -> None:
    assert validate_inventory([("pve1", node())]) == [
        (
            "pve1",
            NodeSpec(
                name="pve1",
                profile="vm",
                gpus=GpuSelector(ids=("10de:2bb1",), count=8),
                sysfs_root="/sys",
                cmdline_path="/proc/cmdline",
            ),
        )
    ]


def test_ids_are_stored_lowercase_and_tuples_accepted() -> None:
    [(_, spec)] = validate_inventory([("pve1", node(gpus={"ids": ("10DE:2BB1", "10de:2Bb5")}))])
    assert spec.gpus.ids == ("10de:2bb1", "10de:2bb5")
    assert spec.gpus.count is None


def test_nodespec_instance_is_accepted_as_is() -> None:
    spec = NodeSpec(name="pve-2", profile="lxc", gpus=GpuSelector(ids=("10de:2bb1",)))
    assert validate_inventory([("h", {"node": spec, "ssh_user": "root"})]) == [("h", spec)]


def test_specs_are_frozen() -> None:
    spec = NodeSpec(name="pve1", gpus=GpuSelector(ids=("10de:2bb1",)))
    with pytest.raises(pydantic.ValidationError):
        spec.name = "pve2"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            node(profile="kvm"),
            ["h: node.profile: must be one of vm, lxc, baremetal (got 'kvm')"],
            id="profile",
        ),
        pytest.param(
            node(gpus={"ids": ["10de:2bb1", "nvidia"]}),
            ["h: node.gpus.ids.1: 'nvidia' is not a vendor:device id like 10de:2bb1"],
            id="id-word",
        ),
        pytest.param(
            node(gpus={"ids": ["10de:2bb"]}),
            ["h: node.gpus.ids.0: '10de:2bb' is not a vendor:device id like 10de:2bb1"],
            id="id-short",
        ),
        pytest.param(
            node(gpus={"ids": "10de:2bb1"}),
            ["h: node.gpus.ids: must be a list (got '10de:2bb1')"],
            id="ids-string",
        ),
        pytest.param(
            node(gpus={"ids": []}),
            ["h: node.gpus.ids: must list at least one vendor:device id"],
            id="ids-empty",
        ),
        pytest.param(
            node(gpus={"ids": ["10de:2bb1", "10DE:2BB1"]}),
            ["h: node.gpus.ids: 10de:2bb1 is listed twice"],
            id="ids-duplicate",
        ),
        pytest.param(
            node(gpus={"ids": ["10de:2bb1"], "count": 0}),
            ["h: node.gpus.count: must be at least 1 (got 0)"],
            id="count-zero",
        ),
        pytest.param(
            node(gpus={"ids": ["10de:2bb1"], "count": "8"}),
            ["h: node.gpus.count: must be a whole number (got '8')"],
            id="count-string",
        ),
        pytest.param(
            node(gpus={"ids": ["10de:2bb1"], "count": True}),
            ["h: node.gpus.count: must be a whole number (got True)"],
            id="count-bool",
        ),
        pytest.param(
            node(gpus={"ids": ["10de:2bb1"], "cout": 8}),
            ["h: node.gpus.cout: unknown field (did you mean 'count'?)"],
            id="unknown-nested-field",
        ),
        pytest.param(
            node(gpu={"ids": ["10de:2bb1"]}),
            ["h: node.gpu: unknown field (did you mean 'gpus'?)"],
            id="unknown-field-near-miss",
        ),
        pytest.param(node(vmid=100), ["h: node.vmid: unknown field"], id="unknown-field"),
        pytest.param(
            node(sysfs_root="sys"),
            ["h: node.sysfs_root: must be an absolute path (got 'sys')"],
            id="relative-sysfs",
        ),
        pytest.param(
            node(cmdline_path="proc/cmdline"),
            ["h: node.cmdline_path: must be an absolute path (got 'proc/cmdline')"],
            id="relative-cmdline",
        ),
        pytest.param(node(cmdline_path=3), ["h: node.cmdline_path: must be a string (got 3)"], id="path-int"),
        pytest.param(
            node(name="pve_1"),
            [
                "h: node.name: 'pve_1' is not a Proxmox node name "
                "(letters, digits and hyphens, starting and ending with a letter or digit)"
            ],
            id="name-underscore",
        ),
        pytest.param(
            node(name="-pve"),
            [
                "h: node.name: '-pve' is not a Proxmox node name "
                "(letters, digits and hyphens, starting and ending with a letter or digit)"
            ],
            id="name-leading-hyphen",
        ),
        pytest.param(
            node(name="pve1.example.com"),
            [
                "h: node.name: 'pve1.example.com' is not a Proxmox node name "
                "(letters, digits and hyphens, starting and ending with a letter or digit)"
            ],
            id="name-fqdn",
        ),
        pytest.param(
            node(name="p" * 64), ["h: node.name: must be at most 63 characters (got 64)"], id="name-too-long"
        ),
        pytest.param(
            {"node": {"gpus": {"ids": ["10de:2bb1"]}}}, ["h: node.name: is required"], id="name-missing"
        ),
        pytest.param({"node": {"name": "pve1"}}, ["h: node.gpus: is required"], id="gpus-missing"),
        pytest.param(
            node(gpus="10de:2bb1"), ["h: node.gpus: must be a mapping (got '10de:2bb1')"], id="gpus-string"
        ),
        pytest.param(
            {"ssh_user": "root"},
            ["h: node: is required (host data needs node = {'name': ..., 'gpus': ...})"],
            id="node-missing",
        ),
        pytest.param({"node": "pve1"}, ["h: node: must be a mapping (got 'pve1')"], id="node-string"),
        pytest.param(["node"], ["h: host data must be a mapping (got ['node'])"], id="data-not-mapping"),
        pytest.param(
            node(name="pve_1", profile="kvm", sysfs_root="sys"),
            [
                "h: node.name: 'pve_1' is not a Proxmox node name "
                "(letters, digits and hyphens, starting and ending with a letter or digit)",
                "h: node.profile: must be one of vm, lxc, baremetal (got 'kvm')",
                "h: node.sysfs_root: must be an absolute path (got 'sys')",
            ],
            id="every-problem-reported",
        ),
    ],
)
def test_error_bad_input_reports_exact_lines(data: object, expected: list[str]) -> None:
    assert problems([("h", data)]) == expected


def test_error_bare_host_name_has_no_node() -> None:
    assert problems(["pve1"]) == [
        "pve1: node: is required (host data needs node = {'name': ..., 'gpus': ...})"
    ]


def test_error_problems_of_all_hosts_in_order() -> None:
    hosts: list[str | tuple[str, object]] = [
        ("a", node(profile="vm")),
        ("b", node(name="pve2", profile="kvm")),
        ("c", node(name="pve3", gpus={"ids": ["x"]})),
    ]
    assert problems(hosts) == [
        "b: node.profile: must be one of vm, lxc, baremetal (got 'kvm')",
        "c: node.gpus.ids.0: 'x' is not a vendor:device id like 10de:2bb1",
    ]


def test_error_node_name_declared_twice() -> None:
    assert problems([("a", node()), ("b", node(name="PVE1"))]) == [
        "b: node.name: 'PVE1' is already the node name of host a"
    ]


def test_exit_on_invalid_returns_valid_hosts_unchanged() -> None:
    hosts = [("pve1", node())]
    assert exit_on_invalid(hosts) is hosts


def test_exit_on_invalid_prints_lines_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        exit_on_invalid([("pve1", node(profile="kvm")), ("pve2", {})])
    assert caught.value.code == 2
    assert capsys.readouterr() == (
        "",
        "pve1: node.profile: must be one of vm, lxc, baremetal (got 'kvm')\n"
        "pve2: node: is required (host data needs node = {'name': ..., 'gpus': ...})\n",
    )


def test_error_pyinfra_stops_before_connecting(tmp_path: Path) -> None:
    """The real pyinfra CLI loads an inventory calling exit_on_invalid: exit 2, our lines, no connection.

    The host name cannot resolve (.invalid), so any connection attempt would print `Connecting to hosts`
    and `Could not resolve hostname`.
    """
    (tmp_path / "inventory.py").write_text(
        "from pvegpu.inventory.validate import exit_on_invalid\n"
        "pve_hosts = exit_on_invalid([\n"
        '    ("pve-nonexistent.invalid", {"node": {"name": "pve1", "profile": "kvm",\n'
        '                                 "gpus": {"ids": ["10de:2bb1", "nvidia"]}}}),\n'
        "])\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory.py", "exec", "--", "true"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "--> Loading config...\n"
        "--> Loading inventory...\n"
        "pve-nonexistent.invalid: node.profile: must be one of vm, lxc, baremetal (got 'kvm')\n"
        "pve-nonexistent.invalid: node.gpus.ids.1: 'nvidia' is not a vendor:device id like 10de:2bb1\n"
    )


def test_every_field_is_described() -> None:
    for model in (NodeSpec, GpuSelector):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"


def test_spec_table_markdown() -> None:
    rows = [line.split(" | ") for line in spec_table_markdown().splitlines()]
    assert [row[:3] for row in rows] == [
        ["| variable", "type", "default"],
        ["|---|---|---|---|"],
        ["| `node.name`", "string", "*required*"],
        ["| `node.profile`", "one of `vm`, `lxc`, `baremetal`", "`vm`"],
        ["| `node.gpus.ids`", "list of strings", "*required*"],
        ["| `node.gpus.count`", "integer or `None`", "`None`"],
        ["| `node.sysfs_root`", "string", "`/sys`"],
        ["| `node.cmdline_path`", "string", "`/proc/cmdline`"],
    ]
    assert rows[0][3] == "description |"
    assert rows[7][3] == "Absolute path of the running kernel command line. |"
    assert rows[3][3] == (
        "Where the inference server runs: `vm` (Q35 VM with the GPUs passed through), "
        "`lxc` (container on the host driver) or `baremetal` (the host itself). |"
    )


class _ExampleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    allow_reboot: bool = Field(default=False, description="example")


def test_every_registered_role_key_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ROLE_SPECS, "example", _ExampleSpec)
    hosts = [("pve1", {**node(), "example": {"allow_reboot": "maybe", "allow_rebot": 1}})]
    with pytest.raises(InventoryError) as raised:
        validate_inventory(hosts)
    assert list(raised.value.problems) == [
        "pve1: example.allow_reboot: must be true or false (got 'maybe')",
        "pve1: example.allow_rebot: unknown field (did you mean 'allow_reboot'?)",
    ]


def test_spec_of_gives_defaults_for_an_absent_role_key_and_refuses_bad_data() -> None:
    assert spec_of({}, "example", _ExampleSpec) == _ExampleSpec(allow_reboot=False)
    assert spec_of({"example": {"allow_reboot": True}}, "example", _ExampleSpec).allow_reboot is True
    with pytest.raises(InventoryError) as raised:
        spec_of({"example": "yes"}, "example", _ExampleSpec)
    assert list(raised.value.problems) == ["example: must be a mapping (got 'yes')"]


def test_spec_of_reads_pyinfras_host_data_as_roles_pass_it() -> None:
    data = HostData(None, {"example": {"allow_reboot": True}})  # type: ignore[arg-type]
    assert spec_of(data, "example", _ExampleSpec).allow_reboot is True
    assert spec_of(HostData(None, {}), "example", _ExampleSpec) == _ExampleSpec(allow_reboot=False)  # type: ignore[arg-type]
