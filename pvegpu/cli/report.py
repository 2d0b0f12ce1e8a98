"""Human-readable views of planned state, shared by the offline CLI and the doctor deploy."""

from __future__ import annotations

from pvegpu.models.hardware import Link
from pvegpu.plan.topology import Topology, Verdict

HEADERS = ("gpu", "address", "model ids", "group", "root bus", "NUMA", "link", "verdict")


def render_table(topology: Topology) -> str:
    """Aligned table, one row per GPU, then the order key, each refusal reason and each problem."""
    rows = [HEADERS] + [
        (
            gpu.name,
            gpu.address,
            f"{gpu.id} {gpu.subsystem_id}",
            _dash(gpu.iommu_group),
            gpu.root_bus,
            _dash(gpu.numa_node),
            format_link(gpu.link),
            gpu.verdict.value,
        )
        for gpu in topology.gpus
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(HEADERS))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.append("")
    lines.append(f"order: {topology.order_key}")
    lines.extend(f"{gpu.name}: {gpu.reason}" for gpu in topology.gpus if gpu.verdict is Verdict.REFUSED)
    lines.extend(f"problem: {problem}" for problem in topology.problems)
    return "\n".join(lines) + "\n"


def format_link(link: Link | None) -> str:
    """`32.0 GT/s x16`, plus `(max ...)` when the link runs below its maximum (idle GPUs drop to 2.5 GT/s)."""
    if link is None:
        return "-"
    current = _speed_width(link.current_speed_gts, link.current_width)
    maximum = _speed_width(link.max_speed_gts, link.max_width)
    return current if current == maximum else f"{current} (max {maximum})"


def _speed_width(speed: float | None, width: int | None) -> str:
    return f"{'?' if speed is None else f'{speed:.1f}'} GT/s x{'?' if width is None else width}"


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)
