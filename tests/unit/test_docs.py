"""The README stays true: its variable table is the models' own, and the example inventory validates."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from pvegpu.cli import main as cli_main
from pvegpu.models.inventory import spec_table_markdown, validate_inventory

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_readme_variable_table_is_generated_from_the_models() -> None:
    start = README.index("<!-- spec-table:start")
    body = README[README.index("\n", start) + 1 : README.index("<!-- spec-table:end -->")]
    assert body == spec_table_markdown()


def test_readme_has_exactly_two_setup_commands() -> None:
    section = README[README.index("## Set up on a fresh machine") : README.index("## What you can run")]
    block = section[section.index("```\n") + 4 : section.index("```", section.index("```\n") + 4)]
    assert block.splitlines() == [
        "bash scripts/demo.sh     # (a) bring up the lab and run the main job on it",
        "bash scripts/test.sh     # (b) run the tests: ruff, mypy --strict, unit, lab and kernel tiers",
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


def test_example_inventory_validates() -> None:
    namespace = runpy.run_path(str(REPO / "inventory.py"))
    specs = validate_inventory(namespace["pve_nodes"])
    assert [(host, spec.name, spec.gpus.ids, spec.gpus.count) for host, spec in specs] == [
        ("pve1.example.net", "pve1", ("10de:2bb1",), 8)
    ]
