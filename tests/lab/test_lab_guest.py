"""The guest roles (deploy/guest.py) against a lab VM guest: a Q35-shaped nspawn host (lab.pve.guest) with
the stand-in NVIDIA apt repository and SGLang wheel (lab/guest_payload.py). Converge, then no change and no
restart; one SGLang setting changed restarts once, also when the run that wrote it stopped before the restart;
the VM env file never enables P2P; bad data stops before pyinfra connects. The API key and its files:
tests/lab/test_lab_secrets.py."""

from __future__ import annotations

import itertools
import json
import os
import re
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import guest_payload, hosts
from pvegpu.models.exporter import GAUGES_SERVICE, GAUGES_SERVICE_FILE
from pvegpu.models.sglang_options import SGLANG_VERSION
from pvegpu.plan.sglang_started import STARTED_RECORD as RECORD

pytestmark = pytest.mark.lab

INVENTORY = "tests/lab/inventories/guest_role.py"
DEPLOY = "deploy/guest.py"
_names = (f"g{os.getpid() % 10000}n{k}" for k in itertools.count(1))

PyinfraCli = Callable[..., subprocess.CompletedProcess[str]]
GAUGES_TIMER_OP = "Keep the live gauges' timer installed, enabled and running"
WRAPPER = "/usr/local/sbin/systemctl"  # ahead of /usr/bin on root's PATH
# The operations of one restart of SGLang, in order.
RESTART = [
    "Reload systemd's units",
    "Start or restart SGLang (its unit, environment or venv changed)",
    "Wait for SGLang to answer",
]
REFUSE_RESTART = (
    "#!/bin/sh\n"
    'case " $* " in *" restart "*sglang*) echo "lab: restart refused" >&2; exit 1;; esac\n'
    'exec /usr/bin/systemctl "$@"\n'
)
LabSsh = Callable[[hosts.LabHost, str], str]


@pytest.fixture
def guest() -> Iterator[hosts.LabHost]:
    name = next(_names)
    try:
        yield guest_payload.up_guest(name)
    finally:
        hosts.down(name)


class Run:
    """One `pyinfra --json` run: exit status, stderr, and each operation's outcome by its name."""

    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        self.rc = result.returncode
        self.stderr = result.stderr
        operations = json.loads(result.stdout)["results"]["operations"] if result.stdout.strip() else []
        # Per operation, the hosts of each outcome.
        self.hosts = {
            op["name"].split(" | ", 1)[1]: {kind: op[kind] for kind in ("success", "error", "no_change")}
            for op in operations
        }
        self.outcome = {
            op["name"].split(" | ", 1)[1]: next(
                kind for kind in ("success", "error", "no_change") if op[kind]
            )
            for op in operations
        }

    def changed(self) -> list[str]:
        return [name for name, outcome in self.outcome.items() if outcome != "no_change"]


def deploy(
    cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch, guest: hosts.LabHost, extra: dict[str, Any]
) -> Run:
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps(extra))
    return Run(cli("--json", "-y", "--limit", guest.name, INVENTORY, DEPLOY, check=False))


def starts(lab_ssh: LabSsh, guest: hosts.LabHost) -> int:
    """How often the (stand-in) SGLang server started: it logs one `serving` line per start (a rank >= 1 of
    several nodes: one `health server` line)."""
    journal = lab_ssh(guest, "journalctl -u sglang.service -o cat --no-pager")
    started = ("sglang STAND-IN (pvegpu lab): serving", "sglang STAND-IN (pvegpu lab): node_rank")
    return sum(line.startswith(started) for line in journal.splitlines())


def test_create_converges_then_noop_then_one_setting_restarts_once_even_after_a_stopped_run(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = deploy(pyinfra_cli, monkeypatch, guest, {})

    assert first.rc == 0, first.stderr
    assert first.outcome["Verify the GPUs, module flavour and version"] == "success"
    assert first.outcome["Wait for SGLang to answer"] == "success"
    assert first.outcome["Start or restart SGLang (its unit, environment or venv changed)"] == "success"
    assert starts(lab_ssh, guest) == 1
    smi = lab_ssh(guest, "nvidia-smi --query-gpu=index,pci.bus_id,driver_version --format=csv,noheader")
    assert smi.splitlines() == [f"{i}, 00000000:0{i + 1}:00.0, 580.95.05" for i in range(8)]
    assert lab_ssh(guest, "systemctl is-active nvidia-persistenced sglang").split() == ["active", "active"]
    models = lab_ssh(
        guest,
        '/opt/sglang/venv/bin/python -c "import urllib.request as u; '
        "print(u.urlopen('http://127.0.0.1:30000/v1/models').read().decode())\"",
    )
    assert json.loads(models)["data"][0]["id"] == "glm-5"
    assert lab_ssh(guest, "stat -c '%a %U' /etc/pvegpu/sglang.env") == "600 root\n"

    second = deploy(pyinfra_cli, monkeypatch, guest, {})

    assert (second.rc, second.changed()) == (0, [])
    assert starts(lab_ssh, guest) == 1

    # A run that wrote the gauges' service file and stopped before reloading systemd's units leaves it newer
    # than what systemd loaded (as `touch` does): the next run reloads them, and only that.
    lab_ssh(guest, f"touch {GAUGES_SERVICE_FILE}")
    assert lab_ssh(guest, f"systemctl show -p NeedDaemonReload --value {GAUGES_SERVICE}") == "yes\n"
    reloaded = deploy(pyinfra_cli, monkeypatch, guest, {})
    assert (reloaded.rc, reloaded.changed()) == (
        0,
        ["Keep the live gauges' timer installed, enabled and running"],
    )
    assert lab_ssh(guest, f"systemctl show -p NeedDaemonReload --value {GAUGES_SERVICE}") == "no\n"
    assert deploy(pyinfra_cli, monkeypatch, guest, {}).changed() == []

    third = deploy(pyinfra_cli, monkeypatch, guest, {"sglang": {"mem_fraction_static": 0.85}})

    assert third.rc == 0, third.stderr
    assert third.changed() == ["Write sglang.service", *RESTART]
    assert starts(lab_ssh, guest) == 2
    unit = lab_ssh(guest, "cat /etc/systemd/system/sglang.service")
    assert " --mem-fraction-static 0.85 " in unit

    # A run that writes the next setting and stops before the restart (here systemctl refuses it): SGLang
    # keeps running what it started from; the next run writes nothing and restarts it from its start record.
    lab_ssh(guest, f"cat > {WRAPPER} <<'EOF'\n{REFUSE_RESTART}EOF\nchmod 755 {WRAPPER}")
    try:
        stopped = deploy(pyinfra_cli, monkeypatch, guest, {"sglang": {"mem_fraction_static": 0.8}})
    finally:
        lab_ssh(guest, f"rm -f {WRAPPER}")

    # pyinfra prints no JSON when the host fails: the run's lines say what it did.
    assert stopped.rc != 0
    assert f"Write sglang.service \n    [{guest.name}] Success" in stopped.stderr
    assert f"[{guest.name}] lab: restart refused" in stopped.stderr
    assert " --mem-fraction-static 0.8 " in lab_ssh(guest, "cat /etc/systemd/system/sglang.service")
    assert starts(lab_ssh, guest) == 2

    finished = deploy(pyinfra_cli, monkeypatch, guest, {"sglang": {"mem_fraction_static": 0.8}})

    assert finished.rc == 0, finished.stderr
    assert finished.changed() == RESTART
    assert (
        "sglang.service runs with another /etc/systemd/system/sglang.service than the one on disk (a run "
        "stopped before restarting it): restarting it"
    ) in finished.stderr
    assert starts(lab_ssh, guest) == 3
    assert " --mem-fraction-static 0.8 " in lab_ssh(guest, "systemctl show -p ExecStart --value sglang")
    again = deploy(pyinfra_cli, monkeypatch, guest, {"sglang": {"mem_fraction_static": 0.8}})
    assert (again.rc, again.changed()) == (0, [])
    assert starts(lab_ssh, guest) == 3


def test_a_service_left_on_an_older_sglang_than_its_venv_holds_restarts_once(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that upgraded the venv's SGLang and stopped before the restart leaves the service on the old
    version, as its start record shows (rewritten here to name an older one): the next run restarts it, from
    that alone, and the one after changes nothing."""
    assert deploy(pyinfra_cli, monkeypatch, guest, {}).rc == 0
    started, older = starts(lab_ssh, guest), "0.5.22"
    site_packages = "/opt/sglang/venv/lib/python3.11/site-packages"
    # The lab's stand-in SGLang is the pinned version with a local label (0.5.23+pvegpulab).
    record = lab_ssh(guest, f"tr '\\0' '\\n' < {RECORD}")
    installed = re.findall(rf"  {site_packages}/sglang-([^/]+)\.dist-info/METADATA$", record, re.MULTILINE)
    assert [version.split("+")[0] for version in installed] == [SGLANG_VERSION]
    lab_ssh(guest, f"sed -i -z 's|/sglang-{installed[0]}.dist-info/|/sglang-{older}.dist-info/|' {RECORD}")

    upgraded = deploy(pyinfra_cli, monkeypatch, guest, {})

    assert (upgraded.rc, upgraded.changed()) == (0, RESTART)
    assert (
        f"sglang.service runs SGLang {older} and /opt/sglang/venv holds {installed[0]} (a run stopped "
        "before restarting it): restarting it"
    ) in upgraded.stderr
    assert starts(lab_ssh, guest) == started + 1
    assert lab_ssh(guest, f"tr '\\0' '\\n' < {RECORD}") == record  # recorded again, as before
    settled = deploy(pyinfra_cli, monkeypatch, guest, {})
    assert (settled.rc, settled.changed()) == (0, [])
    assert starts(lab_ssh, guest) == started + 1


RECIPE_ENV = [
    "SGLANG_ENABLE_JIT_DEEPGEMM=0",
    "SAFETENSORS_FAST_GPU=1",
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
]
MTP = (
    "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4"
)


def argv_of(lab_ssh: LabSsh, guest: hosts.LabHost) -> list[str]:
    """The words of sglang.service's ExecStart."""
    unit = lab_ssh(guest, "cat /etc/systemd/system/sglang.service")
    return next(line for line in unit.splitlines() if line.startswith("ExecStart=")).split()


def test_recipe_serves_the_stand_in_checkpoint_and_a_workload_switch_restarts_once(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in checkpoint has GLM-5's MTP layer: the recipe's options, MTP included, pass the stand-in's
    start-up rules; switching the workload changes the MoE runner alone, restarts once, then nothing."""
    assert deploy(pyinfra_cli, monkeypatch, guest, {}).rc == 0
    before, started = argv_of(lab_ssh, guest), starts(lab_ssh, guest)
    words = " ".join(before)
    assert " --attention-backend flashinfer --model-loader-extra-config " in words
    assert f" --moe-runner-backend cutlass {MTP} " in f"{words} "
    assert " --max-running-requests 64 --cuda-graph-max-bs-decode 64 " in words

    latency = deploy(pyinfra_cli, monkeypatch, guest, {"sglang": {"workload": "latency"}})

    assert latency.rc == 0, latency.stderr
    assert latency.changed() == [
        "Write the service environment (NCCL settings with their reasons)",
        "Write sglang.service",
        *RESTART,
    ]
    after = argv_of(lab_ssh, guest)
    assert [(a, b) for a, b in zip(before, after, strict=True) if a != b] == [
        ("cutlass", "flashinfer_cutlass")
    ]
    assert starts(lab_ssh, guest) == started + 1
    again = deploy(pyinfra_cli, monkeypatch, guest, {"sglang": {"workload": "latency"}})
    assert (again.rc, again.changed()) == (0, [])
    assert starts(lab_ssh, guest) == started + 1


def test_vm_env_file_never_enables_p2p_and_says_why(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = deploy(pyinfra_cli, monkeypatch, guest, {})

    assert run.rc == 0, run.stderr
    env = lab_ssh(guest, "cat /etc/pvegpu/sglang.env").splitlines()
    assert env[1] == (
        "# Profile vm: the GPUs are passed through to this VM, where P2P between them is not supported; "
        "NCCL uses shared memory and nothing here enables P2P"
    )
    recipe = env.index("# Recipe glm5-nvfp4-sm120 (pvegpu/data/sglang/recipes.json)")
    settings = [line for line in env[:recipe] if not line.startswith("#")]
    assert settings == [
        "CUDA_DEVICE_MAX_CONNECTIONS=64",
        "NCCL_BUFFSIZE=8388608",
        "NCCL_DEBUG=INFO",
        "NCCL_IB_DISABLE=1",
        "NCCL_MIN_NCHANNELS=32",
        "NCCL_P2P_DISABLE=1",
    ]
    assert [line for line in env[recipe:] if not line.startswith("#")] == RECIPE_ENV
    assert env[-1].startswith("# left out: --flashinfer-allreduce-fusion-backend: no P2P between the GPUs")
    assert not any(
        "P2P_LEVEL" in line or "IGNORE_DISABLED_P2P" in line or "SHM_DISABLE" in line for line in env
    )
    unit = lab_ssh(guest, "cat /etc/systemd/system/sglang.service")
    assert unit.count(" --enable-p2p-check --disable-custom-all-reduce") == 1
    journal = lab_ssh(guest, "journalctl -u sglang.service -o cat --no-pager")
    assert "NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct" in journal.splitlines()
    doctor = pyinfra_cli("-y", "--limit", guest.name, INVENTORY, "tests/lab/deploys/guest_doctor.py")
    assert "  ranks 0 -> 1: SHM/direct (1 channel)\n" in doctor.stderr
    assert "profile expects" not in doctor.stderr
    assert (
        f"[{guest.name}] NCCL profile SHM (profile vm: no P2P between passed-through GPUs): "
        f"{' '.join(settings)} --enable-p2p-check --disable-custom-all-reduce\n"
    ) in doctor.stderr


def test_error_bad_data_stops_before_connecting(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"sglang": {"extra_args": ["--no-such-flag"]}},
            "sglang.extra_args: --no-such-flag is not an option of sglang serve 0.5.23",
        ),
        (
            {"sglang": {"tp_size": 4}},
            "sglang.tp_size, sglang.pp_size: tp_size 4 x pp_size 1 = 4 GPUs, but the node has 8 GPUs",
        ),
        (
            {"driver": {"version": "570.86.15"}},
            "driver.version: 570.86.15 is below 580.65.06, the oldest driver for the CUDA 13 runtime of "
            "SGLang 0.5.23",
        ),
    ]
    for extra, problem in cases:
        run = deploy(pyinfra_cli, monkeypatch, guest, extra)

        assert run.rc == 2, (extra, run.stderr)
        assert f"{guest.name}: {problem}\n" in run.stderr
        assert "Connecting to hosts" not in run.stderr
    assert lab_ssh(guest, "test -e /etc/pvegpu || echo untouched") == "untouched\n"


def test_drift_doctor_warns_when_transports_contradict_the_profile(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Served as bare metal (no --enable-p2p-check: the stand-in logs P2P channels), checked as a VM.
    assert deploy(pyinfra_cli, monkeypatch, guest, {"node": {"profile": "baremetal"}}).rc == 0
    env = lab_ssh(guest, "cat /etc/pvegpu/sglang.env").splitlines()
    assert env[1] == (
        "# Profile baremetal: the host driver gives P2P between the GPUs; NCCL_P2P_LEVEL lets NCCL use it "
        "across root complexes"
    )
    at = env.index("NCCL_P2P_LEVEL=PHB")  # the guest's GPUs report no NUMA node: one node
    assert env[at - 1] == (
        "# all GPUs on one NUMA node: allow P2P through the CPU's host bridges "
        "(NCCL's default (PXB) would fall back to SHM between root complexes)"
    )
    env_vm = {"node": {"profile": "vm"}}
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps(env_vm))

    run = pyinfra_cli("-y", "--limit", guest.name, INVENTORY, "tests/lab/deploys/guest_doctor.py")

    assert "  ranks 0 -> 1: P2P/CUMEM/read (1 channel)\n" in run.stderr
    assert (
        f"[{guest.name}] ranks 7 -> 0: P2P/CUMEM/read (1 channel); the vm profile expects SHM: P2P is not "
        "supported between passed-through GPUs and forcing it hangs or corrupts data\n"
    ) in run.stderr


def test_bench_compares_settings_and_doctor_shows_nccl_with_and_without_topology_file(
    guest: hosts.LabHost,
    pyinfra_cli: PyinfraCli,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A run without a topology file, then one with (any file the stand-in NCCL can open): each saved and
    labelled as it ran, compared in one table; the doctor shows NCCL's lines of both runs."""
    bench = {"bench": {"results_dir": str(tmp_path), "concurrency": [1, 4], "contexts": [16384]}}
    with_file = {"sglang": {"env": {"NCCL_TOPO_FILE": "/etc/hostname"}}}
    for extra in ({}, with_file):
        assert deploy(pyinfra_cli, monkeypatch, guest, extra).rc == 0
        monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps({**extra, **bench}))
        pyinfra_cli("-y", "--limit", guest.name, INVENTORY, "deploy/bench.py")

    runs = sorted((tmp_path / guest.name).glob("2*.md"))
    assert len(runs) == 2  # run ids are UTC seconds; a run takes longer than that
    table = runs[-1].read_text().splitlines()
    assert table[2] == "Settings in force: numa flat, topo file on, p2p off."
    assert [row.split(" | ")[:3] for row in table[6:]] == [
        ["| 0", "1", "4"],
        ["| 0", "4", "16"],
        ["| 16384", "1", "4"],
    ]
    assert {row.split(" | ")[-1] for row in table[6:]} == {"2.50 |"}  # MTP's accept length, from /server_info
    assert runs[-1].with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [
        (run["host"], run["settings"], [row["concurrency"] for row in run["rows"]]) for run in history
    ] == [
        (guest.name, {"numa": "flat", "topo_file": "off", "p2p": "off"}, [1, 4, 1]),
        (guest.name, {"numa": "flat", "topo_file": "on", "p2p": "off"}, [1, 4, 1]),
    ]
    compared = (tmp_path / guest.name / "compare.md").read_text().splitlines()
    assert [row.split(" | ")[:4] + row.split(" | ")[5:6] for row in compared[6:]] == [
        ["| flat", "off", "off", runs[0].stem, "baseline"],
        ["| flat", "on", "off", runs[1].stem, row_change(compared[7])],
    ]
    assert (tmp_path / guest.name / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Against the reference box: every cell, the reference's MTP-on figure beside it, the ratio of the two.
    vs = (tmp_path / guest.name / "vs-reference.md").read_text().splitlines()
    assert vs[0] == f"# {guest.name} against the reference box: run {runs[-1].stem}"
    assert vs[3].startswith(
        "This node: MTP on (accept length 2.50); settings in force: numa flat, topo file on"
    )
    cells = [line.split(" | ") for line in vs[7:]]
    assert [(c[0], c[1], c[3]) for c in cells] == [
        ("| 0", "1", "93.7"),
        ("| 0", "4", "243.9"),
        ("| 16384", "1", "83.0"),
    ]
    # The ratio is of the unrounded measurement: from the rounded one shown beside it, within 0.01.
    assert all(c[4].endswith(" |") for c in cells)
    assert [abs(float(c[4][:-2]) - float(c[2]) / float(c[3])) <= 0.01 for c in cells] == [True] * 3
    png = (tmp_path / guest.name / "vs-reference.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1000, 400)  # IHDR: the plot's 10 x 4 in at 100 dpi

    doctor = pyinfra_cli("-y", "--limit", guest.name, INVENTORY, "tests/lab/deploys/guest_doctor.py")

    shown = doctor.stderr
    assert "NCCL with the topology file (the current run, logged from " in shown
    assert (
        "UTC): NCCL_TOPO_FILE set by environment to /etc/hostname\n  ranks 0 -> 1: SHM/direct (1 channel)"
        in shown
    )
    assert "NCCL without the topology file (an earlier run, logged from " in shown
    assert "UTC): NCCL_TOPO_FILE not set\n  ranks 0 -> 1: SHM/direct (1 channel)" in shown


def row_change(row: str) -> str:
    """The row's change at concurrency 1, when it has the shape `+12.3%` (the stand-in's speed varies)."""
    cell = row.split(" | ")[5]
    assert re.fullmatch(r"[+-][0-9]+\.[0-9]%", cell), row
    return cell


@pytest.fixture
def two_guests() -> Iterator[tuple[hosts.LabHost, hosts.LabHost]]:
    """Two guests that reach each other, as two nodes of one serving layout do."""
    names = (next(_names), next(_names))
    try:
        pair = (guest_payload.up_guest(names[0]), guest_payload.up_guest(names[1]))
        hosts.route_between(*names)
        yield pair
    finally:
        for name in names:
            hosts.down(name)


def test_two_nodes_tp8_pp2_are_ready_on_both_hosts_then_noop(
    two_guests: tuple[hosts.LabHost, hosts.LabHost],
    pyinfra_cli: PyinfraCli,
    lab_ssh: LabSsh,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TP8 x PP2 over two 8-GPU guests: rank 0 serves the API once rank 1 has joined at dist_init_addr;
    rank 1 serves SGLang's health server only, and is ready when it and rank 0's /health answer."""
    leader, follower = two_guests
    (leader.root / "root/sglang-api-key").write_text("lab-key\n")
    (leader.root / "root/sglang-api-key").chmod(0o600)
    # MTP with PP needs SGLang 0.5.23's opt-in (pvegpu refuses the layout without it).
    layout = {
        "tp_size": 8,
        "pp_size": 2,
        "nnodes": 2,
        "dist_init_addr": f"{leader.address}:5000",
        "env": {"SGLANG_ENABLE_PP_SPEC": "1"},
    }
    ranks = {
        leader.name: {"sglang": {**layout, "host": "0.0.0.0", "api_key_file": "/root/sglang-api-key"}},
        follower.name: {"sglang": {**layout, "node_rank": 1}},
    }
    monkeypatch.setenv("PVEGPU_LAB_HOST_DATA", json.dumps(ranks))
    argv = ("--json", "-y", "--limit", leader.name, "--limit", follower.name, INVENTORY, DEPLOY)

    first = Run(pyinfra_cli(*argv, check=False))

    assert first.rc == 0, first.stderr
    assert first.hosts["Wait for SGLang to answer"] == {
        "success": sorted((leader.name, follower.name)),
        "error": [],
        "no_change": [],
    }
    assert (starts(lab_ssh, leader), starts(lab_ssh, follower)) == (1, 1)
    leader_log = lab_ssh(leader, "journalctl -u sglang.service -o cat --no-pager").splitlines()
    follower_log = lab_ssh(follower, "journalctl -u sglang.service -o cat --no-pager").splitlines()
    assert f"sglang STAND-IN (pvegpu lab): rank 0 waits for 1 ranks at {leader.address}:5000" in leader_log
    assert f"sglang STAND-IN (pvegpu lab): rank 1 joined rank 0 at {leader.address}:5000" in follower_log
    assert "sglang STAND-IN (pvegpu lab): node_rank 1 health server on 127.0.0.1:30000" in follower_log
    unit = lab_ssh(follower, "cat /etc/systemd/system/sglang.service")
    assert " --tp-size 8 --pp-size 2 " in unit
    assert f" --nnodes 2 --node-rank 1 --dist-init-addr {leader.address}:5000" in unit
    assert f" {MTP}" in unit
    # Rank 1 has no API: /v1/models is SGLang's health server's 404.
    status = lab_ssh(
        follower,
        '/opt/sglang/venv/bin/python -c "import urllib.request as u, urllib.error as e\n'
        "try: u.urlopen('http://127.0.0.1:30000/v1/models')\n"
        'except e.HTTPError as x: print(x.code)"',
    )
    assert status == "404\n"

    second = Run(pyinfra_cli(*argv, check=False))

    assert (second.rc, second.changed()) == (0, [])
    assert (starts(lab_ssh, leader), starts(lab_ssh, follower)) == (1, 1)
