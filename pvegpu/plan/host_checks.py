"""The doctor's host checks: observed facts -> rows of (check, state, detail). Pure, read-only.

States: `ok`, `warn` (works, but not as a GPU inference host wants), `problem` (passthrough cannot work),
`unknown` (not observable here; the detail says why), `bios` (Linux cannot see it: check in the BIOS).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pvegpu.models.hardware import Bar, HostHardware
from pvegpu.models.host_checks import HostCheckData
from pvegpu.plan.cmdline import HOST_P2P_PROFILES
from pvegpu.plan.topology import Topology

FOUR_GIB = 1 << 32
# Extended capabilities (PCIe spec 7.6): a 32-bit header at 0x100 (id: bits 0-15, next: bits 20-31).
EXTENDED_START = 0x100
EXT_CAP_ACS = 0x000D
EXT_CAP_REBAR = 0x0015
# ACS control bits (PCIe spec 7.7.8.3): the ones the kernel enables for isolation.
ACS_BITS = ((0, "SrcValid"), (2, "ReqRedir"), (3, "CmpltRedir"), (4, "UpstreamFwd"))
# The two that send peer-to-peer requests and completions up to the root complex (and its IOMMU).
ACS_REDIRECT = (1 << 2) | (1 << 3)
# Default DMA domain types that translate the device's DMA (drivers/iommu/iommu.c iommu_group_show_type).
TRANSLATED = ("DMA", "DMA-FQ")
# Knobs that shape GPU-to-GPU and host latency but that Linux cannot read without vendor tools
# (shared/knowledge/sglang-nccl-drivers-lxc-bios.md, BIOS section).
BIOS_KNOBS = (
    ("DF C-states", "disable for steady P2P/NCCL latency; readable only via AMD HSMP/E-SMI (e_smi_tool)"),
    ("APBDIS", "1 (DF P-state pinned) for steady fabric clocks; AMD HSMP/E-SMI only (--getapbstatus)"),
    ("SOC P-state", "P0 / LCLK DPM pinned; AMD HSMP/E-SMI only (--showlclkdpmlevel)"),
)


@dataclass(frozen=True)
class Check:
    check: str
    state: str
    detail: str


def host_checks(
    hw: HostHardware, topology: Topology, data: HostCheckData, profile: str | None = None
) -> tuple[Check, ...]:
    """Every check row, in report order: platform, then per GPU, then CPU, NUMA and BIOS knobs. On a profile
    whose GPUs talk P2P on the host (`lxc`, `baremetal`), per GPU whether the IOMMU translates its DMA, and
    with ACS redirect above it (the combination in which NCCL's P2P still hangs on this box)."""
    groups = {f.iommu_group for f in hw.functions if f.iommu_group is not None}
    rows = [
        Check("IOMMU", "ok", f"on: {len(groups)} IOMMU groups")
        if hw.iommu_present and groups
        else Check("IOMMU", "problem", "off: no IOMMU groups (enable IOMMU / SVM / VT-d in the BIOS)"),
        Check("interrupt remapping", "ok", f"on: {data.remapped_interrupts} IR- lines in /proc/interrupts")
        if data.remapped_interrupts
        else Check("interrupt remapping", "warn", "off: no IR- interrupt chip in /proc/interrupts"),
    ]
    for gpu in topology.gpus:
        function = hw.by_address[gpu.gpu_function]
        rows.extend(_acs(gpu.name, port, data.config.get(port, b"")) for port in function.parents)
        if profile in HOST_P2P_PROFILES:
            redirecting = [
                port
                for port in function.parents
                if (acs_control(data.config.get(port, b"")) or 0) & ACS_REDIRECT
            ]
            group = function.iommu_group
            rows.append(
                _translation(gpu.name, None if group is None else data.group_types.get(group), redirecting)
            )
        rows.extend(_bars(gpu.name, function.bars))
        rows.append(_rebar(gpu.name, data.config.get(gpu.gpu_function, b"")))
    rows.append(_cstates(data))
    rows.append(
        Check(
            "NUMA nodes", "ok", ", ".join(f"node{n}: cpus {c}" for n, c in sorted(data.numa_cpulists.items()))
        )
        if data.numa_cpulists
        else Check("NUMA nodes", "unknown", "no /sys/devices/system/node/node*/cpulist")
    )
    rows.extend(Check(name, "bios", detail) for name, detail in BIOS_KNOBS)
    return tuple(rows)


def extended_capabilities(config: bytes) -> dict[int, int]:
    """Extended capability id -> offset. Pure; {} when the config read stopped before 0x100."""
    found: dict[int, int] = {}
    offset = EXTENDED_START
    while EXTENDED_START <= offset <= len(config) - 4 and offset not in found.values():
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        found.setdefault(header & 0xFFFF, offset)
        offset = (header >> 20) & 0xFFC
    return found


def checks_to_json(host: str, rows: tuple[Check, ...]) -> dict[str, object]:
    return {"host": host, "checks": [asdict(row) for row in rows]}


def render_checks(rows: tuple[Check, ...]) -> str:
    """A plain table: check, state, detail."""
    width = max(len(row.check) for row in rows)
    lines = [f"{'check'.ljust(width)}  {'state'.ljust(7)}  detail"]
    lines.extend(f"{row.check.ljust(width)}  {row.state.ljust(7)}  {row.detail}" for row in rows)
    return "\n".join(lines)


def _unreadable(config: bytes) -> str:
    return f"config space read returned {len(config)} bytes (extended capabilities need root and 4096)"


def acs_control(config: bytes) -> int | None:
    """The ACS control register (capability + 6) of `config`; None when unreadable or without ACS."""
    offset = extended_capabilities(config).get(EXT_CAP_ACS) if len(config) > 0x100 else None
    return None if offset is None else int.from_bytes(config[offset + 6 : offset + 8], "little")


def _translation(gpu: str, group_type: str | None, redirecting: list[str]) -> Check:
    name = f"{gpu} DMA translation"
    if group_type is None:
        return Check(name, "unknown", "its IOMMU group's type was not readable")
    if group_type == "identity":
        return Check(name, "ok", "passthrough (identity): the IOMMU does not translate the GPU's DMA")
    if group_type not in TRANSLATED:
        return Check(name, "unknown", f"IOMMU group type {group_type!r}")
    if redirecting:
        return Check(
            name,
            "warn",
            f"translated ({group_type}) with ACS redirect at {', '.join(redirecting)}: NCCL's P2P hangs in "
            "this combination; reboot into pvegpu's iommu=pt or turn ACS off in the BIOS, else set "
            "NCCL_P2P_DISABLE=1",
        )
    return Check(
        name,
        "warn",
        f"translated ({group_type}): P2P DMA goes through the IOMMU; reboot into pvegpu's iommu=pt",
    )


def _acs(gpu: str, port: str, config: bytes) -> Check:
    name = f"{gpu} ACS at {port}"
    if len(config) <= 0x100:
        return Check(name, "unknown", _unreadable(config))
    control = acs_control(config)
    if control is None:
        return Check(name, "ok", "no ACS capability (P2P is not redirected here)")
    enabled = [label for bit, label in ACS_BITS if control >> bit & 1]
    if enabled:
        return Check(name, "warn", f"ACS on ({' '.join(enabled)}): P2P goes through the root complex")
    return Check(name, "ok", "ACS off")


def _bars(gpu: str, bars: tuple[Bar, ...]) -> list[Check]:
    rows = []
    for bar in bars:
        if bar.is_io or bar.index > 5 or not bar.size:
            continue
        above = bar.start >= FOUR_GIB
        state = "ok" if above or bar.size < (1 << 28) else "warn"
        where = "above 4 GiB" if above else "below 4 GiB"
        kind = "64-bit" if bar.is_64bit else "32-bit"
        rows.append(
            Check(f"{gpu} BAR{bar.index}", state, f"{_size(bar.size)} {kind} at {bar.start:#x}, {where}")
        )
    return rows


def _rebar(gpu: str, config: bytes) -> Check:
    name = f"{gpu} Resizable BAR"
    if len(config) <= 0x100:
        return Check(name, "unknown", _unreadable(config))
    offset = extended_capabilities(config).get(EXT_CAP_REBAR)
    if offset is None:
        return Check(name, "warn", "no Resizable BAR capability")
    first = int.from_bytes(config[offset + 8 : offset + 12], "little")
    count = (first >> 5) & 0x7
    parts = []
    for entry in range(max(count, 1)):
        control = int.from_bytes(config[offset + 8 + 8 * entry : offset + 12 + 8 * entry], "little")
        parts.append(f"BAR{control & 0x7} {_size(1 << (((control >> 8) & 0x3F) + 20))}")
    return Check(name, "ok", "current sizes: " + ", ".join(parts))


def _cstates(data: HostCheckData) -> Check:
    if not data.idle_states:
        return Check("CPU C-states", "unknown", "no cpuidle states on cpu0 (no idle driver, or C-states off)")
    states = ", ".join(f"{s.name}{' (disabled)' if s.disabled else ''}" for s in data.idle_states)
    deep = [s.name for s in data.idle_states if not s.disabled and s.name not in ("POLL", "C1")]
    if deep:
        return Check("CPU C-states", "warn", f"{states}: deep states enabled (latency spikes under load)")
    return Check("CPU C-states", "ok", states)


def _size(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"
