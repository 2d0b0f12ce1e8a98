"""Benchmark: wall time of a no-op `pyinfra inventory/lab.py deploy/doctor.py` against 1 and 8 lab hosts, and
the number of remote commands pyinfra runs per host. A benchmark script, not a timed test: these machines are
noisy, so it reports the median and the minimum of several runs. Run as root, after `bash lab/bootstrap.sh`:

    .venv/bin/python scripts/bench.py [--hosts 1 8] [--runs 5]

It starts its own hosts (`bench1`...), refusing to touch hosts it did not start, and stops them at the end.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab import hosts  # noqa: E402  (the lab package lives in the repository, next to this script)

PYINFRA = Path(sys.executable).with_name("pyinfra")
COMMAND_LINE = re.compile(r"Running command on (\S+):")
REPORT_LINE = re.compile(r"\[(\S+)\] GPU topology of node")


def pyinfra(names: list[str], *extra: str) -> str:
    limits = [arg for name in names for arg in ("--limit", name)]
    argv = [str(PYINFRA), "inventory/lab.py", "deploy/doctor.py", "-y", *limits, *extra]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    reported = set(REPORT_LINE.findall(output))
    if done.returncode != 0 or reported != set(names):
        raise SystemExit(f"pyinfra failed ({done.returncode}; reports from {sorted(reported)}):\n{output}")
    return output


def commands_per_host(names: list[str]) -> dict[str, int]:
    """Count the remote commands of one run, from pyinfra's own debug log."""
    counts = dict.fromkeys(names, 0)
    for match in COMMAND_LINE.finditer(pyinfra(names, "--debug")):
        counts[match.group(1)] += 1
    return counts


def measure(count: int, runs: int) -> tuple[list[float], dict[str, int]]:
    names = [f"bench{index}" for index in range(1, count + 1)]
    taken = sorted(set(names) & {host.name for host in hosts.list_hosts()})
    if taken:
        raise SystemExit(f"lab hosts {', '.join(taken)} are up already; stop them first (python -m lab down)")
    try:
        for name in names:
            hosts.up(name, "reference")
        pyinfra(names)  # warm-up: page cache, Python bytecode
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            pyinfra(names)
            times.append(time.perf_counter() - started)
        return times, commands_per_host(names)
    finally:
        for name in names:
            hosts.down(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 8], help="host counts to measure")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per host count")
    args = parser.parse_args()
    rows = [("hosts", "runs", "median s", "min s", "remote commands per host")]
    for count in args.hosts:
        times, commands = measure(count, args.runs)
        per_host = sorted(set(commands.values()))
        rows.append(
            (
                str(count),
                str(len(times)),
                f"{statistics.median(times):.2f}",
                f"{min(times):.2f}",
                "/".join(str(n) for n in per_host),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
