"""A node's benchmark run against the reference box (`pvegpu.models.bench_reference`): `vs_reference`
pairs each cell of the run's matrix with the reference's figure for the same MTP state, `vs_reference_table`
writes `vs-reference.md`. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.models.bench_reference import Reference
from pvegpu.plan.bench import BenchCell, BenchRow, SpeedSettings


@dataclass(frozen=True)
class VsCell:
    """One cell: the node's tok/s (None: not run within `bench.max_minutes`) and the reference's (low,
    high) tok/s (None: it published none for this cell)."""

    cell: BenchCell
    node: float | None
    reference: tuple[float, float] | None

    def ratio(self) -> str:
        """`0.91` (or `0.82-0.86` against a range); `-` where either side is missing."""
        if self.node is None or self.reference is None or not all(self.reference):
            return "-"
        low, high = (self.node / figure for figure in reversed(self.reference))
        return f"{low:.2f}" if low == high else f"{low:.2f}-{high:.2f}"


def node_mtp(rows: Sequence[BenchRow]) -> float | None:
    """The run's MTP accept length (the longest reported; None: the node served without MTP)."""
    accepted = [row.accept_length for row in rows if row.accept_length]
    return max(accepted) if accepted else None


def vs_reference(
    cells: Sequence[BenchCell], rows: Sequence[BenchRow], reference: Reference
) -> tuple[VsCell, ...]:
    """Every cell of the matrix, in order, with the node's result and the reference's figure for the node's
    MTP state."""
    mtp = node_mtp(rows) is not None
    measured = {(row.concurrency, row.context): row.output_throughput for row in rows}
    return tuple(
        VsCell(
            cell,
            measured.get((cell.concurrency, cell.context)),
            reference.figure(mtp, cell.concurrency, cell.context),
        )
        for cell in cells
    )


def _figure(value: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    low, high = value
    return f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"


def vs_reference_table(
    host: str,
    run_id: str,
    vs: Sequence[VsCell],
    *,
    reference: Reference,
    accept_length: float | None,
    settings: SpeedSettings,
    max_minutes: int,
) -> str:
    """`vs-reference.md`: the node's tok/s per cell beside the reference's, with the ratio."""
    mtp = "off" if accept_length is None else f"on (accept length {accept_length:.2f})"
    lines = [
        f"# {host} against the reference box: run {run_id}",
        "",
        f"Reference: {reference.name}, {reference.box}, MTP {'off' if accept_length is None else 'on'} "
        f"({reference.source}).",
        f"This node: MTP {mtp}; settings in force: {settings.describe()}. Its figures are measured by this "
        "run; the reference's are published ones.",
        "",
        "| context | concurrency | this node tok/s | reference tok/s | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for cell in vs:
        node = f"not run (bench.max_minutes {max_minutes})" if cell.node is None else f"{cell.node:.1f}"
        lines.append(
            f"| {cell.cell.context} | {cell.cell.concurrency} | {node} | {_figure(cell.reference)} | "
            f"{cell.ratio()} |"
        )
    return "\n".join(lines) + "\n"
