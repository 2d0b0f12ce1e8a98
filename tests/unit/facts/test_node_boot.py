"""The node's boot part (pvegpu/facts/node_boot.py): the bootloader and boot files read with one command,
each part parsed by its own fact's parser."""

from __future__ import annotations

import subprocess

import pytest

from pvegpu.facts.boot import BootLoader, parse_boot_loader
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.node_boot import node_boot_command, parse_node_boot
from pvegpu.facts.pvegpu_boot import PvegpuBootFiles, parse_boot_files
from tests.unit.fuzz_targets import BOOT_FILES, BOOT_LOADER


def test_parts_parsed_by_their_own_parsers() -> None:
    assert parse_node_boot((*BOOT_LOADER, *BOOT_FILES)) == (
        parse_boot_loader(BOOT_LOADER),
        parse_boot_files(BOOT_FILES),
    )


def test_one_command_here_gives_what_the_two_facts_give() -> None:
    def run(command: str) -> list[str]:
        return subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, check=True
        ).stdout.splitlines()

    both = parse_node_boot(run(node_boot_command()))
    assert both == (
        BootLoader().process(run(BootLoader().command())),
        PvegpuBootFiles().process(run(PvegpuBootFiles().command())),
    )


def test_error_truncated_before_the_first_end() -> None:
    with pytest.raises(FactParseError) as error:
        parse_node_boot(BOOT_LOADER[:3])
    assert str(error.value) == "node boot state: no #pvegpu:end marker (truncated output)"
