"""pvegpu's own gauges in Prometheus' text format, for the node exporter's textfile collector. Pure; stdlib
only (the node's pre-start hook renders its file with it: pvegpu/hook/bundle.py bundles it).

Debian's `prometheus-node-exporter` reads `*.prom` in its default `--collector.textfile.directory`
(/var/lib/prometheus/node-exporter) at every scrape. pvegpu writes five files there
(pvegpu/models/exporter.py), each whole and atomically (a temporary file in the same directory whose name
does not end in `.prom`, then a rename), so a scrape never sees half a file, and no series is in two files
(the collector fails the scrape then):

- `pvegpu_node.prom`, by each `deploy/site.py` run on a Proxmox node (roles/node_exporter.py): where the
  node loads the driver, its next boot (pvegpu/run/gauges.py);
- `pvegpu_serving.prom`, by each `deploy/site.py` run on a serving host: the model verified, the P2P
  decision of a VM guest, its next boot, as the run leaves them;
- `pvegpu_hook.prom`, by the node's pre-start hook at every VM start: its result, when it ran, and per GPU
  the health of the VM's mappings after its repairs;
- `pvegpu_sglang.prom`, live: by the serving host's `pvegpu-gauges.timer` every 30 s, SGLang's readiness
  probe and when it ran (`sglang_help`, the script templates/node_exporter/pvegpu-sglang-gauges.sh.j2);
- `pvegpu_mappings.prom`, live: by the node's `pvegpu-gauges.timer` every 30 s (the hook's bundle with
  `--gauges`), per GPU of the VM the mapping's health as the hook would decide it now (`mapping_gauges`).

A run's files carry no time: their content changes only when a value does, so a second run changes nothing.
The hook's and the timers' files carry their check's time. Every gauge's HELP line is fixed here, so
the same gauge name never comes with two help texts (the collector refuses that across files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# name -> HELP text (module docstring: one text per name).
HELP = {
    "pvegpu_mapping_healthy": (
        "1: the node's map line of this GPU mapping matches the live hardware (status valid); 0: drift "
        "(a renumbering the hook can repair) or changed"
    ),
    "pvegpu_mapping_checked_timestamp_seconds": "When the node's gauges timer last checked the VM's mappings",
    "pvegpu_p2p_enabled": "1: the VM guest's NCCL plan uses P2P between its GPUs; 0: SHM (label: vm.p2p)",
    "pvegpu_p2p_verdict": "1 for the P2P probe's verdict recorded in the VM guest (p2p or shm), and its mode",
    "pvegpu_next_boot_module_ready": (
        "1: the kernel the host boots next has the NVIDIA module of the driver built; 0: a reboot would "
        "lose the driver"
    ),
    "pvegpu_model_complete": (
        "1: the model directory holds the pinned revision as verified (sha256 once, then size and mtime)"
    ),
    "pvegpu_sglang_ready": "1: SGLang answered /health and /v1/models at the gauges timer's last check",
    "pvegpu_sglang_ready_checked_timestamp_seconds": "When the gauges timer last probed SGLang (Unix time)",
    "pvegpu_hook_last_run_timestamp_seconds": "When the pre-start hook last ran for this VM (Unix time)",
    "pvegpu_hook_start_allowed": "1: the pre-start hook let the VM start; 0: it refused the start",
    "pvegpu_hook_result": "1 for the pre-start hook's last result for this VM",
    "pvegpu_hook_mapping_healthy": (
        "1: the GPU mapping is valid after the pre-start hook's repairs; 0: changed hardware, not repaired"
    ),
}

# The pre-start hook's results (`pvegpu_hook_result`'s `result` label).
HOOK_RESULTS = ("valid", "repaired", "refused", "unchecked", "failed")


@dataclass(frozen=True)
class Sample:
    """One line of a gauge: its labels (in this order) and value."""

    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Gauge:
    """A gauge `name` (a key of `HELP`) and its samples."""

    name: str
    samples: tuple[Sample, ...]


def render(gauges: Sequence[Gauge]) -> str:
    """The text format of `gauges`, in the order given: HELP, TYPE and the samples of each; a gauge with no
    sample is left out. KeyError for a name without a HELP text here."""
    lines: list[str] = []
    for gauge in gauges:
        if not gauge.samples:
            continue
        lines += [f"# HELP {gauge.name} {HELP[gauge.name]}", f"# TYPE {gauge.name} gauge"]
        lines += [f"{gauge.name}{_labels(sample.labels)} {_value(sample.value)}" for sample in gauge.samples]
    return "".join(f"{line}\n" for line in lines)


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escaped(value)}"' for name, value in labels) + "}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def flag(value: bool) -> float:
    return 1.0 if value else 0.0


@dataclass(frozen=True)
class NextBootValue:
    """The kernel the host boots next (`none`: no image), the driver version and whether the kernel has its
    module (plan/kernel_guard.py `kernel_problems` finds nothing)."""

    kernel: str
    driver: str
    ready: bool


@dataclass(frozen=True)
class ModelValue:
    """`sglang.model_path`, `model_repo`, `model_revision` (`main` when unpinned) and whether the fetcher's
    record and the file list show it complete (plan/model_fetch.py `fetch_reason` finds nothing)."""

    path: str
    repo: str
    revision: str
    complete: bool


@dataclass(frozen=True)
class P2pValue:
    """A VM guest's node's `vm.p2p`, whether the guest's NCCL plan uses P2P, and the probe's recorded
    (mode, verdict) when the guest holds one."""

    mode: str
    used: bool
    record: tuple[str, str] | None = None


def node_file(next_boot: NextBootValue | None = None) -> str:
    """The node's file: the next boot where the node loads the driver itself (`lxc`, `baremetal`); empty
    elsewhere. The mappings' health is live, the timer's (`mapping_gauges`): a run's value of it was only
    ever "synced when the run ended"."""
    return render(_next_boot(next_boot))


def serving_file(
    *,
    model: ModelValue | None = None,
    p2p: P2pValue | None = None,
    next_boot: NextBootValue | None = None,
) -> str:
    """The serving host's file; a gauge whose value is None is left out. SGLang's readiness is live, the
    timer's (`sglang_help`)."""
    gauges: list[Gauge] = []
    if model is not None:
        labels = (("path", model.path), ("repo", model.repo), ("revision", model.revision))
        gauges.append(Gauge("pvegpu_model_complete", (Sample(labels, flag(model.complete)),)))
    if p2p is not None:
        gauges.append(Gauge("pvegpu_p2p_enabled", (Sample((("mode", p2p.mode),), flag(p2p.used)),)))
        if p2p.record is not None:
            mode, verdict = p2p.record
            gauges.append(Gauge("pvegpu_p2p_verdict", (Sample((("mode", mode), ("verdict", verdict)), 1.0),)))
    return render([*gauges, *_next_boot(next_boot)])


def _next_boot(value: NextBootValue | None) -> list[Gauge]:
    if value is None:
        return []
    labels = (("kernel", value.kernel), ("driver", value.driver))
    return [Gauge("pvegpu_next_boot_module_ready", (Sample(labels, flag(value.ready)),))]


@dataclass(frozen=True)
class HookGpu:
    """One of the VM's GPU mappings as the hook left it: its bus address now (`path`, "" when the node has no
    line), the hook's status word (`unchanged`, `repaired`, `refused`) and whether it is healthy."""

    mapping: str
    path: str
    status: str
    healthy: bool


def hook_gauges(
    vmid: int, node: str, result: str, at: float, gpus: Sequence[HookGpu] = ()
) -> tuple[Gauge, ...]:
    """The hook's file (module docstring): `result` one of `HOOK_RESULTS`, `at` the start's Unix time."""
    if result not in HOOK_RESULTS:
        raise ValueError(f"{result!r} is not a hook result {HOOK_RESULTS}")
    vm = (("node", node), ("vmid", str(vmid)))
    allowed = result in ("valid", "repaired", "unchecked", "failed")
    return (
        Gauge("pvegpu_hook_last_run_timestamp_seconds", (Sample(vm, at),)),
        Gauge("pvegpu_hook_start_allowed", (Sample(vm, flag(allowed)),)),
        Gauge("pvegpu_hook_result", (Sample((*vm, ("result", result)), 1.0),)),
        Gauge(
            "pvegpu_hook_mapping_healthy",
            tuple(
                Sample((*vm, ("mapping", g.mapping), ("path", g.path), ("status", g.status)), flag(g.healthy))
                for g in gpus
            ),
        ),
    )


def sglang_help() -> dict[str, str]:
    """The HELP text of each gauge the serving host's timer writes (its script renders them, in this
    order: `pvegpu_sglang_ready` 1/0, then when it probed)."""
    names = ("pvegpu_sglang_ready", "pvegpu_sglang_ready_checked_timestamp_seconds")
    return {name: HELP[name] for name in names}


@dataclass(frozen=True)
class MappingHealth:
    """One of the VM's GPU mappings as the hook would decide it now, without writing: its node's map line's
    bus address (`path`, "" without one), `status` `valid`, `drift` (a renumbering the hook repairs in
    `repair` mode) or `changed` (anything else, a mapping missing from pci.cfg included)."""

    mapping: str
    path: str
    status: str


MAPPING_STATUSES = ("valid", "drift", "changed")


def mapping_gauges(node: str, vmid: int, at: float, gpus: Sequence[MappingHealth]) -> tuple[Gauge, ...]:
    """The node's timer's file (module docstring): per GPU `pvegpu_mapping_healthy{mapping,node,path,status,
    vmid}` (1 only for `valid`), and `at`, the check's Unix time."""
    vm = (("node", node), ("vmid", str(vmid)))
    samples = []
    for gpu in gpus:
        if gpu.status not in MAPPING_STATUSES:
            raise ValueError(f"{gpu.status!r} is not a mapping status {MAPPING_STATUSES}")
        labels = (("mapping", gpu.mapping), ("node", node), ("path", gpu.path), ("status", gpu.status))
        samples.append(Sample((*labels, ("vmid", str(vmid))), flag(gpu.status == "valid")))
    return (
        Gauge("pvegpu_mapping_healthy", tuple(samples)),
        Gauge("pvegpu_mapping_checked_timestamp_seconds", (Sample(vm, at),)),
    )
