"""HostSpec (host data key `pve_host`): defaults, and bad values named by field before any host is touched."""

from __future__ import annotations

import pytest

from pvegpu.inventory.tables import spec_table_markdown
from pvegpu.inventory.validate import validate_inventory
from pvegpu.models.errors import InventoryError
from pvegpu.models.host import HostSpec

NODE = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}


def test_defaults() -> None:
    assert HostSpec() == HostSpec(allow_reboot=False, extra_cmdline=(), reboot_timeout_s=600)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            {"node": {**NODE, "profile": "vms"}},
            "pve1: node.profile: must be one of vm, lxc, baremetal (got 'vms')",
        ),
        (
            {"node": NODE, "pve_host": {"extra_cmdline": ["pcie_aspm=off", "bad token"]}},
            "pve1: pve_host.extra_cmdline.1: 'bad token' is not a kernel parameter like name or name=value "
            "(letters, digits, _ . - in the name; no spaces or quotes)",
        ),
        (
            {"node": NODE, "pve_host": {"extra_cmdline": ['x="a"']}},
            "pve1: pve_host.extra_cmdline.0: 'x=\"a\"' is not a kernel parameter like name or name=value "
            "(letters, digits, _ . - in the name; no spaces or quotes)",
        ),
        (
            {"node": NODE, "pve_host": {"extra_cmdline": ["iommu=pt", "iommu=pt"]}},
            "pve1: pve_host.extra_cmdline: iommu=pt is listed twice",
        ),
        (
            {"node": NODE, "pve_host": {"allow_reboot": "yes"}},
            "pve1: pve_host.allow_reboot: must be true or false (got 'yes')",
        ),
        (
            {"node": NODE, "pve_host": {"reboot_timout_s": 60}},
            "pve1: pve_host.reboot_timout_s: unknown field (did you mean 'reboot_timeout_s'?)",
        ),
        (
            {"node": NODE, "pve_host": {"reboot_timeout_s": 5}},
            "pve1: pve_host.reboot_timeout_s: must be at least 30 (got 5)",
        ),
    ],
)
def test_error_names_the_field(data: dict[str, object], problem: str) -> None:
    with pytest.raises(InventoryError) as raised:
        validate_inventory([("pve1", data)])
    assert raised.value.problems == (problem,)


def test_table_rows() -> None:
    rows = spec_table_markdown(HostSpec, "pve_host").splitlines()
    assert [row.split(" | ")[:3] for row in rows[2:]] == [
        ["| `pve_host.allow_reboot`", "boolean", "`False`"],
        ["| `pve_host.extra_cmdline`", "list of strings", "`()`"],
        ["| `pve_host.allow_reboot_with_foreign_guests`", "boolean", "`False`"],
        ["| `pve_host.reboot_timeout_s`", "integer", "`600`"],
    ]
