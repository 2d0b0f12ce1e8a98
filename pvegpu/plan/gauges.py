"""pvegpu's own gauges in Prometheus' text format, for the node exporter's textfile collector. Pure; stdlib
only (the node's pre-start hook renders its file with it: pvegpu/hook/bundle.py bundles it).

Debian's `prometheus-node-exporter` reads `*.prom` in its default `--collector.textfile.directory`
(/var/lib/prometheus/node-exporter) at every scrape. pvegpu writes three files there
(pvegpu/models/exporter.py), each whole and atomically (a temporary file in the same directory, then a
rename), so a scrape never sees half a file:

- `pvegpu_node.prom`, by each `deploy/site.py` run on a Proxmox node (roles/node_exporter.py): the node's PCI
  mappings, as the run leaves them (pvegpu/run/gauges.py);
- `pvegpu_serving.prom`, by each `deploy/site.py` run on a serving host: SGLang ready, the model verified,
  the P2P decision of a VM guest, as the run leaves them;
- `pvegpu_hook.prom`, by the node's pre-start hook at every VM start: its result, when it ran, and per GPU
  the health of the VM's mappings after its repairs.

A run's files carry no time: their content changes only when a value does, so a second run changes nothing.
The hook's file carries the start's time (each start is an event). Every gauge's HELP line is fixed here, so
the same gauge name never comes with two help texts (the collector refuses that across files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# name -> HELP text (module docstring: one text per name).
HELP = {
    "pvegpu_mapping_healthy": (
        "1: the node's map line of this GPU mapping describes its card, as the last deploy/site.py run "
        "synced it"
    ),
    "pvegpu_p2p_enabled": "1: the VM guest's NCCL plan uses P2P between its GPUs; 0: SHM (label: vm.p2p)",
    "pvegpu_p2p_verdict": "1 for the P2P probe's verdict recorded in the VM guest (p2p or shm), and its mode",
    "pvegpu_next_boot_module_ready": (
        "1: the kernel the host boots next has the NVIDIA module of the driver built; 0: a reboot would "
        "lose the driver"
    ),
    "pvegpu_model_complete": (
        "1: the model directory holds the pinned revision as verified (sha256 once, then size and mtime)"
    ),
    "pvegpu_sglang_ready": "1: SGLang answered /health and /v1/models at the last deploy/site.py run's read",
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


def node_file(node: str, mappings: Sequence[tuple[str, bool]], next_boot: NextBootValue | None = None) -> str:
    """The node's file: `pvegpu_mapping_healthy{mapping,node}` per (mapping id, healthy), and the next boot
    where the node loads the driver itself (`lxc`, `baremetal`). No bus address among the labels: a hook's
    repair renumbers it, and the file would then change on the next run with no change of health (the hook's
    own gauge names the address)."""
    samples = tuple(Sample((("mapping", mapping), ("node", node)), flag(ok)) for mapping, ok in mappings)
    return render([Gauge("pvegpu_mapping_healthy", samples), *_next_boot(next_boot)])


def serving_file(
    *,
    sglang_ready: bool | None,
    model: ModelValue | None = None,
    p2p: P2pValue | None = None,
    next_boot: NextBootValue | None = None,
) -> str:
    """The serving host's file; a gauge whose value is None is left out (`sglang_ready` None: no SGLang
    here, or not yet: its node's driver waits)."""
    gauges: list[Gauge] = []
    if sglang_ready is not None:
        gauges.append(Gauge("pvegpu_sglang_ready", (Sample((), flag(sglang_ready)),)))
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
