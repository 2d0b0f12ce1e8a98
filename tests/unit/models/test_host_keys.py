"""SSH host keys: the shipped inventories check them strictly; a host whose data turns the check off gets a
warning naming it when the inventory loads (once, whatever the groups it is in), and the run goes on."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from pvegpu.models.host_keys import host_key_warnings
from tests.unit.inventory_cli import doctor_with_inventory

REPO = Path(__file__).resolve().parents[3]
NODE = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"], "count": 8}}
TRUST_ANY = "pyinfra connects to whatever key the host shows, an impostor's included"
TOFU = "pyinfra trusts and records whatever key the host shows first (trust on first use)"
FIX = "set it to 'yes' and record the host's key in its ssh_known_hosts_file (README, Security)"


@pytest.mark.parametrize(
    ("inventory", "groups"),
    [
        ("inventory.py", ["pve_nodes", "vm_guests"]),
        ("inventory/baremetal.py", ["pve_nodes", "baremetal_hosts"]),
        ("inventory/lxc.py", ["pve_nodes", "lxc_guests"]),
    ],
)
def test_shipped_inventories_check_host_keys_strictly(
    inventory: str, groups: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = runpy.run_path(str(REPO / inventory))
    hosts = [entry for group in groups for entry in namespace[group]]
    assert hosts
    for name, data in hosts:
        assert data["ssh_strict_host_key_checking"] == "yes", name
        assert data["ssh_known_hosts_file"] == str(REPO / "known_hosts"), name
    # Only guests_of's line for the VM's guest, not made yet in a fresh clone: no host-key warning.
    assert "warning" not in capsys.readouterr().err


def test_warning_for_each_host_that_turns_checking_off() -> None:
    hosts: list[str | tuple[str, object]] = [
        ("a", {"ssh_strict_host_key_checking": "no"}),
        ("b", {"ssh_strict_host_key_checking": "yes"}),
        ("c", {"ssh_strict_host_key_checking": "accept-new"}),
        ("d", {}),
        "e",
        ("f", {"ssh_strict_host_key_checking": "off"}),
    ]
    assert host_key_warnings(hosts) == [
        f"warning: a: ssh_strict_host_key_checking is 'no': {TRUST_ANY}; {FIX}",
        f"warning: c: ssh_strict_host_key_checking is 'accept-new': {TOFU}; {FIX}",
        f"warning: f: ssh_strict_host_key_checking is 'off': {TRUST_ANY}; {FIX}",
    ]


def test_pyinfra_cli_warns_once_naming_the_host_and_goes_on(tmp_path: Path) -> None:
    """The real pyinfra CLI on an inventory whose host is in two groups: one warning line, then pyinfra goes
    on to connect (the name cannot resolve, .invalid, so the run then fails there)."""
    host = "pve-unchecked.invalid"
    data = {"ssh_strict_host_key_checking": "no", "node": {**NODE, "profile": "vm"}}
    result = doctor_with_inventory(
        tmp_path,
        "from pvegpu.inventory.guests import exit_on_invalid_guests\n"
        "from pvegpu.inventory.validate import exit_on_invalid\n"
        f"pve_nodes = exit_on_invalid([({host!r}, {data!r})])\n"
        f"baremetal_hosts = exit_on_invalid_guests(pve_nodes)\n",
    )
    warning = f"warning: {host}: ssh_strict_host_key_checking is 'no': {TRUST_ANY}; {FIX}"
    assert result.stderr.splitlines().count(warning) == 1, result.stderr
    assert result.stderr.index(warning) < result.stderr.index("Connecting to hosts")
