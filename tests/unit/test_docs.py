"""The README stays true: its variable table is the models' own, and the example inventory validates."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from pvegpu.cli.main import main as cli_main
from pvegpu.inventory.tables import spec_table_markdown
from pvegpu.inventory.validate import ROLE_SPECS, validate_inventory
from scripts import readme_tables

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_readme_variable_tables_are_generated_from_the_models() -> None:
    assert sorted(readme_tables.keys_in(README)) == sorted(ROLE_SPECS)
    assert readme_tables.render(README) == README


def test_readme_table_of_node_is_the_node_spec() -> None:
    start = README.index("<!-- spec-table:node:start -->\n") + len("<!-- spec-table:node:start -->\n")
    assert README[start : README.index("<!-- spec-table:node:end -->")] == spec_table_markdown()


def test_readme_has_exactly_two_setup_commands() -> None:
    section = README[README.index("## Set up on a fresh machine") : README.index("## What you can run")]
    block = section[section.index("```\n") + 4 : section.index("```", section.index("```\n") + 4)]
    assert block.splitlines() == [
        "bash scripts/demo.sh     # (a) bring up the lab and run the main job on it",
        "bash scripts/test.sh     # (b) run the tests: ruff, mypy --strict, lint-imports, unit, lab and "
        "kernel tiers",
    ]
    ci = (REPO / ".ci/run").read_text()
    assert "bash scripts/test.sh" in ci


@pytest.mark.parametrize(
    "command",
    [
        "pyinfra inventory.py deploy/host.py",
        "pyinfra inventory.py deploy/vm.py",
        "pyinfra inventory.py deploy/guest.py",
        "pyinfra inventory.py deploy/site.py",
        "pyinfra inventory.py deploy/rebuild_vm.py",
        "pyinfra inventory/baremetal.py deploy/site.py",
        "pyinfra inventory.py deploy/doctor.py",
        "pyinfra inventory.py deploy/bench.py",
        "pvegpu topology --sysfs-root DIR",
        "pvegpu mapping --node NAME=SYSFS_DIR",
    ],
)
def test_readme_lists_every_user_command_with_its_state(command: str) -> None:
    row = next(line for line in README.splitlines() if line.startswith(f"| `{command}"))
    state = row.rstrip(" |").rsplit("|", 1)[1].strip()
    words = command.split()
    exists = (REPO / words[2]).exists() if words[0] == "pyinfra" else words[1] in cli_main.commands
    assert state.startswith("works") if exists else state == "not yet", row


def test_example_inventory_validates(capsys: pytest.CaptureFixture[str]) -> None:
    """The node validates; its VM's guest joins `vm_guests` once pvegpu has made its keys (not in a fresh
    clone: the info line says so)."""
    namespace = runpy.run_path(str(REPO / "inventory.py"))
    specs = validate_inventory([*namespace["pve_nodes"], *namespace["vm_guests"]])
    assert [(host, spec.name, spec.profile, spec.gpus.ids, spec.gpus.count) for host, spec in specs] == [
        ("pve1.example.net", "pve1", "vm", ("10de:2bb1",), 8),
    ]
    assert capsys.readouterr().err == (
        "info: guest llm of pve1.example.net is not in this run's inventory: its keys in "
        f"{REPO}/guest-keys/pve1 do not exist yet (made when pvegpu creates the VM); the next run "
        "includes it\n"
    )


@pytest.mark.parametrize(
    ("inventory", "profile"), [("inventory/baremetal.py", "baremetal"), ("inventory/lxc.py", "lxc")]
)
def test_profile_inventories_reuse_the_example_hosts_with_their_profile(inventory: str, profile: str) -> None:
    namespace = runpy.run_path(str(REPO / inventory))
    specs = validate_inventory(namespace["pve_nodes"])
    assert [(host, spec.name, spec.profile) for host, spec in specs] == [
        ("pve1.example.net", "pve1", profile)
    ]
