"""The doctor's NCCL runs with and without the topology file, read from the service's journal by invocation.

Channel lines are real (shared/fixtures/real 15: nkotikal/NCCL-Tensor-Parallelism @ 0071dd79, NCCL 2.28.9,
4x A100, a run without NCCL_TOPO_FILE; 14 part C: NVIDIA/nccl #1817, P2P/direct pointer). No capture holds
NCCL's topology-file lines: those are NCCL's format strings (topo.cc, xml.cc) with pvegpu's path. The journal
wrapping is `journalctl -o json --output-fields=_SYSTEMD_INVOCATION_ID,MESSAGE`'s shape (every value a
string; a MESSAGE that is not UTF-8 a list of byte values).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.nccl import topology_file_lines, topology_file_read
from pvegpu.facts.nccl_journal import NcclRuns, parse_nccl_runs, topology_file_report
from pvegpu.facts.sglang import SglangNcclRuns
from tests.unit.realdata import real_fixture

SET = "llm:4711:4711 [0] NCCL INFO NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml"
FAILED_OLD = (
    "llm:4711:4711 [0] NCCL WARN Could not open XML topology file /etc/pvegpu/nccl-topo.xml : No such file"
)
AT_18 = 1764612000000000  # 2025-12-01 18:00:00 UTC in µs


def real_15() -> list[str]:
    return [line for line in real_fixture("15_nccl_debug_info_shm_direct_vs_p2p_cumem_4x_a100.txt")
            .read_text().splitlines() if "NCCL INFO Channel" in line]  # fmt: skip


def real_14_part_c() -> list[str]:
    text = real_fixture("14_nccl_debug_info_shm_and_p2p_older_formats.txt").read_text()
    return [line for line in text.split("\n----\n")[2].splitlines() if "via " in line]


def entry(invocation: str, message: object, at: int) -> str:
    return json.dumps({
        "__CURSOR": f"s=1;i={at}", "__REALTIME_TIMESTAMP": str(at), "__MONOTONIC_TIMESTAMP": "1",
        "_BOOT_ID": "b0", "_SYSTEMD_INVOCATION_ID": invocation, "MESSAGE": message,
    })  # fmt: skip


def journal(current: str) -> list[str]:
    """Three starts: with the file (earlier), without (real 14 part C), with the file again (current)."""
    return [
        f"current {current}",
        entry("aaa", SET, AT_18 - 7200_000000),
        *(entry("aaa", line, AT_18 - 7200_000000) for line in real_15()[:2]),
        *(entry("bbb", line, AT_18 - 3600_000000 + n) for n, line in enumerate(real_14_part_c())),
        entry("ccc", SET, AT_18),
        *(entry("ccc", line, AT_18 + 5) for line in real_15()),
    ]


def test_latest_run_with_and_without_the_file_from_the_journal() -> None:
    runs = parse_nccl_runs(journal("ccc"))
    assert runs.current == "ccc"
    assert [(run.invocation, run.started_us, len(run.channels)) for run in runs.runs] == [
        ("aaa", AT_18 - 7200_000000, 2), ("bbb", AT_18 - 3600_000000, 3), ("ccc", AT_18, 16),
    ]  # fmt: skip
    assert runs.latest(with_topology_file=True) == runs.runs[2]
    assert runs.latest(with_topology_file=False) == runs.runs[1]
    assert topology_file_report(runs) == (
        "NCCL with the topology file (the current run, logged from 2025-12-01 18:00:00 UTC): "
        "NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml\n"
        "  ranks 0 -> 1: P2P/CUMEM/read (4 channels)\n"
        "  ranks 1 -> 2: SHM/direct/direct (4 channels)\n"
        "  ranks 2 -> 3: P2P/CUMEM/read (4 channels)\n"
        "  ranks 3 -> 0: SHM/direct/direct (4 channels)",
        "NCCL without the topology file (an earlier run, logged from 2025-12-01 17:00:00 UTC): "
        "NCCL_TOPO_FILE not set\n"
        "  ranks 1 -> 0: P2P/direct pointer (1 channel)\n"
        "  ranks 7 -> 6: P2P/direct pointer (2 channels)",
    )


def test_a_file_nccl_could_not_open_is_a_run_without_it() -> None:
    lines = [
        "current ",
        entry("ddd", SET, AT_18),
        entry("ddd", FAILED_OLD, AT_18),
        entry("ddd", real_15()[1], AT_18),
    ]
    runs = parse_nccl_runs(lines)
    assert runs.current is None
    assert runs.latest(with_topology_file=True) is None
    assert topology_file_report(runs) == (
        "NCCL with the topology file: no run in the journal that logged NCCL's channels (pvegpu writes the "
        "file on a VM guest whose node is in the run's inventory: run deploy/site.py)",
        "NCCL without the topology file (an earlier run, logged from 2025-12-01 18:00:00 UTC): "
        "NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml; Could not open XML topology file "
        "/etc/pvegpu/nccl-topo.xml : No such file\n"
        "  ranks 1 -> 2: SHM/direct/direct (1 channel)",
    )


def test_only_runs_with_channel_lines_count_and_an_empty_journal_says_how_to_get_both() -> None:
    runs = parse_nccl_runs(["current eee", entry("eee", SET, AT_18)])  # a start that died before its channels
    assert runs.latest(with_topology_file=True) is None
    assert parse_nccl_runs([]) == NcclRuns(current=None)
    assert topology_file_report(NcclRuns(current=None))[1] == (
        "NCCL without the topology file: no run in the journal that logged NCCL's channels (to get one: set "
        "sglang.env.NCCL_TOPO_FILE to an empty value, run deploy/site.py and deploy/doctor.py, then remove "
        "the override and run deploy/site.py again)"
    )


def test_empty_topo_file_value_names_no_file() -> None:
    assert topology_file_lines(["x [0] NCCL INFO NCCL_TOPO_FILE set by environment to "]) == ()
    assert not topology_file_read(())


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("state ccc", "NCCL journal line 1: expected 'current <invocation id>', got 'state ccc'"),
        ('{"MESSAGE": "x"}', "NCCL journal line 2: not a journal entry ('_SYSTEMD_INVOCATION_ID')"),
        ("not json", "NCCL journal line 2: not a journal entry (Expecting value: line 1 column 1 (char 0))"),
        (entry("ccc", [78, 67], AT_18), "NCCL journal line 2: not a journal entry (MESSAGE is [78, 67])"),
    ],
)
def test_error_other_shapes_name_the_line(line: str, problem: str) -> None:
    lines = [line] if line.startswith("state") else ["current ccc", line]
    with pytest.raises(FactParseError) as caught:
        parse_nccl_runs(lines)
    assert str(caught.value) == problem


def test_fact_command_keeps_only_nccl_lines_of_every_run(tmp_path: Path) -> None:
    """The fact's shell line against stand-in `systemctl` and `journalctl` printing the journal's JSON, other
    lines of the service included: the grep keeps channel and topology-file lines only."""
    noise = [entry("ccc", "llm [0] NCCL INFO Bootstrap : Using eth0", AT_18), entry("ccc", "serving", AT_18)]
    lines = journal("ccc")[1:]
    (tmp_path / "journal.json").write_text("\n".join([*noise, *lines]) + "\n")
    for name, body in (("systemctl", "echo ccc"), ("journalctl", f"cat {tmp_path / 'journal.json'}")):
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    environ = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    command = SglangNcclRuns().command()
    output = subprocess.run(["sh", "-c", command], env=environ, capture_output=True, text=True, check=True)
    assert output.stdout.splitlines() == ["current ccc", *lines]
    assert SglangNcclRuns().process(output.stdout.splitlines()) == parse_nccl_runs(journal("ccc"))
