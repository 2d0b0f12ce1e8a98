"""Kernel tier: a real Linux kernel computes the IOMMU groups of every lab topology; the generator must agree.

Each case boots lab/kernel/boot.sh (Debian's kernel, QEMU TCG q35, emulated IOMMU, the topology's devices as
`lab.kernel.qemu.realize` builds them) and compares the groups the kernel reports with those `lab.grouping`
computes for the same realized description: same functions at the same places (matched by position, so bus
numbering cannot hide a difference), same partition, same group numbers. Nothing is hard-coded here: the
kernel is the reference. Boots run in parallel, one per CPU: 7 boots of ~5-7 s, ~30-45 s on 2 quiet cores
(1-4 min while other work keeps both cores busy).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from lab.grouping import iommu_groups
from lab.kernel.qemu import Probed, parse_probe, realize
from lab.topologies import TOPOLOGIES
from lab.topology import Placed, place

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]
BOOT = REPO / "lab/kernel/boot.sh"
CASES = [(name, "intel") for name in sorted(TOPOLOGIES)] + [("reference", "amd")]
PROBE = "qemu-q35-intel-iommu-linux-6.1-probe.txt"


def _boot(topology: str, iommu: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(BOOT), topology, iommu],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # above boot.sh's own bound on the boot (PVEGPU_KERNEL_TIMEOUT, 300 s)
        check=False,
    )


@pytest.fixture(scope="module")
def boots(
    request: pytest.FixtureRequest,
) -> Iterator[dict[tuple[str, str], Future[subprocess.CompletedProcess[str]]]]:
    """Starts, in parallel, the boots the selected tests of this module need."""
    wanted: set[tuple[str, str]] = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if isinstance(item, pytest.Function) and item.module is request.module and callspec is not None:
            wanted.add(tuple(callspec.params["case"]))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        yield {case: pool.submit(_boot, *case) for case in sorted(wanted)}


def _report(
    boots: dict[tuple[str, str], Future[subprocess.CompletedProcess[str]]], case: tuple[str, str]
) -> str:
    result = boots[case].result()
    assert result.returncode == 0, f"boot.sh {' '.join(case)} failed:\n{result.stderr[-3000:]}"
    return result.stdout


def _by_position(functions: list[Placed], groups: dict[str, int]) -> dict[str, tuple[int, int | None]]:
    return {p.key: (p.function.class_code, groups.get(p.address)) for p in functions}


def _kernel_by_position(probed: tuple[Probed, ...]) -> dict[str, tuple[int, int | None]]:
    return {p.key: (p.class_code, p.group) for p in probed}


def _partition(positions: dict[str, tuple[int, int | None]]) -> set[frozenset[str]]:
    members: dict[int, set[str]] = {}
    for key, (_, group) in positions.items():
        if group is not None:
            members.setdefault(group, set()).add(key)
    return {frozenset(m) for m in members.values()}


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_kernel_and_generator_agree(
    boots: dict[tuple[str, str], Future[subprocess.CompletedProcess[str]]], case: tuple[str, str]
) -> None:
    topology, iommu = case
    kernel = _kernel_by_position(parse_probe(_report(boots, case)))
    realized = list(place(realize(TOPOLOGIES[topology], iommu).topology))
    model = _by_position(realized, iommu_groups(realized))

    assert sorted(model) == sorted(kernel)  # the same functions at the same places
    assert _partition(model) == _partition(kernel)
    assert model == kernel  # and the same classes and group numbers (probe order)


@pytest.mark.parametrize("case", [("qemu-probe", "intel")], ids=["fixture"])
def test_tier_reproduces_the_captured_probe(
    boots: dict[tuple[str, str], Future[subprocess.CompletedProcess[str]]], case: tuple[str, str]
) -> None:
    """Today's boot (pcie_ports=compat, the lab's initramfs) reports exactly what the capture in
    shared/fixtures/real-kernel recorded for the same layout, booted without those options."""
    shared = Path(os.environ.get("PVEGPU_SHARED", REPO.parent / "shared"))
    capture = shared / "fixtures" / "real-kernel" / PROBE
    if not capture.is_file():
        pytest.skip(f"real-kernel capture {capture} not found (set PVEGPU_SHARED to the shared folder)")

    assert parse_probe(_report(boots, case)) == parse_probe(capture.read_text())
