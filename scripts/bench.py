"""Benchmarks on the lab: a benchmark script, not a timed test (these machines are noisy, so it reports
medians and minimums of several runs, interleaved where two things are compared). Run as root, after
`bash lab/bootstrap.sh`:

    .venv/bin/python scripts/bench.py [--hosts 1 8] [--runs 5] [--nodes 1 16] [--site-runs 7] [--before DIR]
                                      [--pin]

1. doctor: a no-op `pyinfra inventory/lab.py deploy/doctor.py` against 1 and 8 lab hosts (`bench1`...), and
   the remote commands pyinfra runs per host (`--hosts` with no count skips it).
2. host: Proxmox lab nodes `hnode1`... made as `python -m lab up NAME --topology reference --pve --boot grub`
   makes them (netns mode), converged by `deploy/host.py` (the first run reboots them) until a run changes
   nothing; then the no-op `deploy/host.py` on 1 and on 16 nodes (`--nodes`; with no count skips it): each
   count is the nodes up at the time (1 node up, then the others brought up and converged), `--runs` timed
   runs that must change nothing, interleaved with pyinfra's floor on the same nodes (as in 3), each one's
   ratio to the smallest count, and the remote commands per node of one `--debug-all` run (pyinfra's and
   pvesh's, as in 3).
3. site: a Proxmox lab node (`bench`) and its VM guest (`benchv100`), converged by `deploy/site.py` as
   `bash scripts/demo.sh` does; then the no-op `deploy/site.py` and pyinfra's floor (scripts/bench_floor.py:
   one no-op `files.directory` per host) on the same two hosts, interleaved; their ratio; and the remote
   commands per host on every SSH connection, from one `--debug-all` run: pyinfra's `Running command on
   <host>` lines, and pvegpu.pve's `Running pvesh on <address>` lines (proxmoxer's connection to the node)
   (`--site-runs 0` skips it).
   With `--pin`, the site and floor runs again with pyinfra on one CPU and the lab's hosts (their processes,
   the Proxmox stand-in's companion) on the others: as remote hosts are, which do not share the CPUs pyinfra
   runs on (the state reads sent ahead, pvegpu/run/early_read.py, then run beside pyinfra's own work).
4. with `--before DIR`, a checkout of an older commit (`git worktree add /tmp/before 3fbdbde`): its no-op
   `deploy/site.py` (run in DIR with DIR first on PYTHONPATH, so that its pvegpu shadows this checkout's
   editable install) against this checkout's, interleaved, on the same converged node + guest. Every timed
   site run must change nothing, else the benchmark stops.

It keeps its hosts in a lab run directory of its own (/run/pvegpu-bench, via PVEGPU_LAB_RUN), so it never
sees nor stops another lab's hosts; it refuses to start while that directory has hosts, and stops its own at
the end. inventory/lab.py lists every host of that directory, so each section stops its hosts before the
next one starts (no section shares hosts with another).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab import boot, hosts  # noqa: E402  (the lab package lives in the repository, next to this script)
from lab.pve import node as pve_node  # noqa: E402

PYINFRA = Path(sys.executable).with_name("pyinfra")
RUN_DIR = Path("/run/pvegpu-bench")
NODE = "bench"
GUEST = f"{NODE}v100"  # lab.pve.hypervisor.guest_name of inventory/lab.py's VM 100
SITE = "deploy/site.py"
HOST = "deploy/host.py"
HOST_NODE = "hnode"  # the host section's Proxmox lab nodes: hnode1, hnode2...
FLOOR = "scripts/bench_floor.py"
# pyinfra's line for each command it runs; a state read sent ahead that the run did not take ran as well
# (pvegpu/run/early_read.py; one it takes is the command pyinfra's line names).
COMMAND_LINE = re.compile(r"Running command on (\S+):|Dropped the read sent ahead on (\S+):")
PVESH_LINE = re.compile(r"Running pvesh on (\S+):")
REPORT_LINE = re.compile(r"\[(\S+)\] GPU topology of node")
# pyinfra's summary: op-host pairs, changed, failed, unchanged ("-" for none).
GRAND_TOTAL = re.compile(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.MULTILINE)
CONVERGE_RUNS = 5


def pyinfra(
    deploy: str, *extra: str, checkout: Path = REPO, cpus: set[int] | None = None
) -> tuple[float, str]:
    """(wall seconds, output) of `pyinfra -y inventory/lab.py DEPLOY` run in `checkout` (on `cpus` when
    given); SystemExit on failure. Another checkout than this one goes first on PYTHONPATH (its pvegpu, lab
    and roles)."""
    argv = [str(PYINFRA), "-y", *extra, "inventory/lab.py", deploy]
    env = dict(os.environ)
    if checkout != REPO:
        env["PYTHONPATH"] = str(checkout)
    started = time.perf_counter()
    done = subprocess.run(
        argv,
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    elapsed = time.perf_counter() - started
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} in {checkout} failed ({done.returncode}):\n{output}")
    return elapsed, output


def ran(output: str) -> list[str]:
    """The host of each command a debug log shows run (`COMMAND_LINE`)."""
    return [ran or dropped for ran, dropped in COMMAND_LINE.findall(output)]


def changed(output: str) -> str:
    """The `changed` column of pyinfra's grand total ("-": nothing changed); SystemExit on a failure."""
    totals = GRAND_TOTAL.findall(output)
    if len(totals) != 1 or totals[0][2] != "-":
        raise SystemExit(f"no grand total, or an operation failed:\n{output}")
    return str(totals[0][1])


def unchanged(deploy: str, checkout: Path = REPO, cpus: set[int] | None = None) -> float:
    """Wall seconds of one run of `deploy` (on `cpus` when given) that must change nothing."""
    elapsed, output = pyinfra(deploy, checkout=checkout, cpus=cpus)
    if changed(output) != "-":
        raise SystemExit(f"{deploy} in {checkout} changed something; not a no-op run:\n{output}")
    return elapsed


def table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print()


def timing_row(label: str, times: Sequence[float]) -> list[str]:
    return [label, str(len(times)), f"{statistics.median(times):.2f}", f"{min(times):.2f}"]


def interleaved(
    runs: int, first: tuple[str, Path], second: tuple[str, Path], cpus: set[int] | None = None
) -> tuple[list[float], ...]:
    """`runs` no-op runs of each (deploy, checkout), alternating which goes first, after one warm-up each
    (pyinfra on `cpus` when given)."""
    pair = (first, second)
    for deploy, checkout in pair:
        unchanged(deploy, checkout, cpus)
    times: tuple[list[float], list[float]] = ([], [])
    for round_ in range(runs):
        order = (0, 1) if round_ % 2 == 0 else (1, 0)
        for index in order:
            times[index].append(unchanged(*pair[index], cpus))
    return times


# ------------------------------------------------------------------------------------------------ doctor


def doctor(names: list[str], *extra: str) -> str:
    limits = [arg for name in names for arg in ("--limit", name)]
    _, output = pyinfra("deploy/doctor.py", *limits, *extra)
    reported = set(REPORT_LINE.findall(output))
    if reported != set(names):
        raise SystemExit(f"doctor reported on {sorted(reported)}, not {names}:\n{output}")
    return output


def measure_doctor(count: int, runs: int) -> list[str]:
    names = [f"{NODE}{index}" for index in range(1, count + 1)]
    try:
        for name in names:
            hosts.up(name, "reference")
        doctor(names)  # warm-up: page cache, Python bytecode
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            doctor(names)
            times.append(time.perf_counter() - started)
        counts = Counter(ran(doctor(names, "--debug")))
    finally:
        for name in names:
            hosts.down(name)
    per_host = sorted({counts[name] for name in names})
    return [*timing_row(str(count), times), "/".join(map(str, per_host))]


# -------------------------------------------------------------------------------------------------- host


def node_up(name: str) -> None:
    """Proxmox lab node `name` as `python -m lab up NAME --topology reference --pve --boot grub` makes it
    (netns mode), less the stand-in NVIDIA repository that only the `lxc` and `baremetal` profiles read."""
    boot.install(pve_node.up(name, "reference", "netns"), "grub")


def converge_host() -> None:
    """Run deploy/host.py until a run changes nothing (a new node's first run reboots it)."""
    for _ in range(CONVERGE_RUNS):
        _, output = pyinfra(HOST)
        if changed(output) == "-":
            return
    raise SystemExit(f"{HOST} still changes something after {CONVERGE_RUNS} runs")


def measure_host(counts: Sequence[int], runs: int) -> None:
    """The no-op deploy/host.py with each count of nodes up, smallest first: the nodes of the previous count
    stay up and converged, the new ones are brought up and converged."""
    names: list[str] = []
    measured: list[tuple[int, list[float], list[float], dict[str, tuple[int, int]]]] = []
    try:
        for count in sorted(set(counts)):
            while len(names) < count:
                names.append(f"{HOST_NODE}{len(names) + 1}")
                node_up(names[-1])
            converge_host()
            times, floor = interleaved(runs, (HOST, REPO), (FLOOR, REPO))
            measured.append((count, times, floor, remote_commands(HOST, names)))
    finally:
        for name in names:
            hosts.down(name)
    base_count, base_times, base_floor, _ = measured[0]
    base = f"{base_count} node{'s' if base_count > 1 else ''}"
    print(f"no-op {HOST} on Proxmox lab nodes (GRUB, netns), interleaved with the floor (median of {runs}):")
    rows = [
        [
            "nodes",
            "runs",
            "median s",
            "min s",
            f"ratio to {base}",
            "floor median s",
            f"floor ratio to {base}",
            "remote commands per node (pyinfra + pvesh)",
        ]
    ]
    for count, times, floor, per_node in measured:
        ratio = statistics.median(times) / statistics.median(base_times)
        floor_ratio = statistics.median(floor) / statistics.median(base_floor)
        commands = "/".join(f"{ours} + {api}" for ours, api in sorted(set(per_node.values())))
        row = [*timing_row(str(count), times), f"{ratio:.2f}", f"{statistics.median(floor):.2f}"]
        rows.append([*row, f"{floor_ratio:.2f}", commands])
    table(rows)


# -------------------------------------------------------------------------------------------------- site


def converge_site() -> None:
    """Bring up the node and run deploy/site.py until a run that had the guest in its inventory changes
    nothing (run 1: host, mappings, VM; run 2: the guest; run 3: no change)."""
    up = ["up", NODE, "--topology", "reference", "--pve", "--boot", "grub", "--mode", "nspawn"]
    done = subprocess.run(
        [sys.executable, "-m", "lab", *up], cwd=REPO, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"python -m lab {' '.join(up)} failed ({done.returncode}):\n{done.stderr}")
    for _ in range(CONVERGE_RUNS):
        guest_up = GUEST in {host.name for host in hosts.list_hosts()}
        _, output = pyinfra(SITE)
        if guest_up and changed(output) == "-":
            return
    raise SystemExit(f"{SITE} still changes something after {CONVERGE_RUNS} runs")


def remote_commands(deploy: str, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Per host of one no-op `deploy` run: (commands on pyinfra's connection, pvesh calls on proxmoxer's);
    SystemExit when the run changed something or ran commands on other hosts than `names`."""
    _, output = pyinfra(deploy, "--debug-all")
    if changed(output) != "-":
        raise SystemExit(f"{deploy} changed something; not a no-op run:\n{output}")
    addresses = {host.address: host.name for host in hosts.list_hosts()}
    pyinfra_counts = Counter(ran(output))
    pvesh_counts = Counter(addresses[address] for address in PVESH_LINE.findall(output))
    if set(pyinfra_counts) != set(names):
        raise SystemExit(f"{deploy} ran commands on {sorted(pyinfra_counts)}, not {sorted(names)}:\n{output}")
    return {name: (pyinfra_counts[name], pvesh_counts[name]) for name in names}


def host_processes() -> set[int]:
    """Every process of the lab's hosts: each host's process tree (its sshd, and the sessions pyinfra's
    commands run in), and the Proxmox stand-in's hypervisor companion."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    found = {host.pid for host in hosts.list_hosts()}
    found |= {int(path.read_text()) for path in RUN_DIR.glob("*/companion.pid")}
    while True:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        if not children:
            return found
        found |= children


def pin_hosts(cpus: set[int]) -> None:
    """Every thread of every lab host process on `cpus` (what they start inherits it)."""
    for pid in host_processes():
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:
                continue  # exited meanwhile


def ratio_table(site: Sequence[float], floor: Sequence[float]) -> None:
    ratio = statistics.median(site) / statistics.median(floor)
    table(
        [
            ("run", "runs", "median s", "min s"),
            timing_row(f"{SITE}, no change", site),
            timing_row("floor: one no-op files.directory", floor),
            (f"ratio site / floor: {ratio:.2f}", "", "", ""),
        ]
    )


def measure_site(runs: int, before: Path | None, pin: bool) -> None:
    cpus = os.sched_getaffinity(0)
    pinned = None
    try:
        converge_site()
        site, floor = interleaved(runs, (SITE, REPO), (FLOOR, REPO))
        counts = remote_commands(SITE, (NODE, GUEST))
        previous = interleaved(runs, (SITE, before), (SITE, REPO)) if before is not None else None
        if pin:
            pin_hosts(cpus - {min(cpus)})
            pinned = interleaved(runs, (SITE, REPO), (FLOOR, REPO), cpus={min(cpus)})
    finally:
        hosts.down_all()
    print(f"node + VM guest ({NODE}, {GUEST}), no-op runs, interleaved:")
    ratio_table(site, floor)
    if pinned is not None:
        others = sorted(cpus - {min(cpus)})
        print(
            f"the same, pyinfra on CPU {min(cpus)} and the lab's hosts on CPU {', '.join(map(str, others))}"
            " (remote hosts do not share the CPUs pyinfra runs on):"
        )
        ratio_table(*pinned)
    print(f"remote commands of a no-op {SITE} run:")
    rows = [["host", "pyinfra", "pvesh (proxmoxer)", "total"]]
    rows += [[name, str(ours), str(api), str(ours + api)] for name, (ours, api) in counts.items()]
    table(rows)
    if previous is not None and before is not None:
        revision = subprocess.run(
            ["git", "-C", str(before), "log", "-1", "--format=%h"], capture_output=True, text=True, check=True
        ).stdout.strip()
        print(f"{SITE}, no change, before ({before} at {revision}) and after (this checkout), interleaved:")
        table(
            [
                ("checkout", "runs", "median s", "min s"),
                timing_row(f"before {revision}", previous[0]),
                timing_row("after", previous[1]),
            ]
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, nargs="*", default=[1, 8], help="doctor: host counts")
    parser.add_argument("--runs", type=int, default=5, help="doctor, host: timed runs per host/node count")
    parser.add_argument("--nodes", type=int, nargs="*", default=[1, 16], help="host: Proxmox node counts")
    parser.add_argument("--site-runs", type=int, default=7, help="site: timed runs of each deploy (0: skip)")
    parser.add_argument("--before", type=Path, help="site: an older checkout to compare the no-op run with")
    parser.add_argument("--pin", action="store_true", help="site: also pyinfra, hosts on own CPUs")
    args = parser.parse_args()
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin puts pyinfra and the lab's hosts on different CPUs: it needs 2 or more")
    if args.before is not None and args.site_runs == 0:
        parser.error("--before compares site runs: it needs --site-runs above 0")
    os.environ["PVEGPU_LAB_RUN"] = str(RUN_DIR)  # lab.hosts and every pyinfra run read it
    if hosts.list_hosts():
        raise SystemExit(
            f"{RUN_DIR} has lab hosts; stop them: PVEGPU_LAB_RUN={RUN_DIR} python -m lab down --all"
        )
    if args.hosts:
        print(f"no-op deploy/doctor.py (median of {args.runs}):")
        rows = [["hosts", "runs", "median s", "min s", "remote commands per host"]]
        rows += [measure_doctor(count, args.runs) for count in args.hosts]
        table(rows)
    if args.nodes:
        measure_host(args.nodes, args.runs)
    if args.site_runs:
        measure_site(args.site_runs, args.before.resolve() if args.before else None, args.pin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
