"""Fuzz every pure parser of pvegpu (tests/unit/fuzz_targets.py) and print a table.

    .venv/bin/python scripts/fuzz.py                   # 10,000 examples per parser
    .venv/bin/python scripts/fuzz.py -n 500 -k nccl    # fewer, only parsers whose name holds "nccl"

A failure is any exception other than the parser's own parse error (or that error without a message); the
first input of each failing parser is printed after the table. Exit status 1 when any parser failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.unit.fuzz_targets import TARGETS, Target, crash, inputs  # noqa: E402


def fuzz(target: Target, examples: int) -> tuple[int, int, float, str | None]:
    """(examples run, failures, seconds, first failure with its input) for `target`."""
    counts = {"run": 0, "failed": 0}
    first: list[str] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # count every failure instead of stopping at and shrinking the first
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        lines = data.draw(inputs(target))
        counts["run"] += 1
        problem = crash(target, lines)
        if problem is not None:
            counts["failed"] += 1
            if not first:
                first.append(f"{problem}\n    input: {lines!r:.600}")

    start = time.monotonic()
    run()
    return counts["run"], counts["failed"], time.monotonic() - start, first[0] if first else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--examples", type=int, default=10_000, help="examples per parser")
    parser.add_argument("-k", "--select", default="", help="only parsers whose name holds this text")
    args = parser.parse_args()
    chosen = [target for target in TARGETS if args.select.lower() in target.name.lower()]
    width = max(len(target.name) for target in chosen)
    print(f"{'parser':<{width}}  {'examples':>8}  {'failures':>8}  {'seconds':>7}")
    found = []
    for target in chosen:
        run, failed, seconds, first = fuzz(target, args.examples)
        print(f"{target.name:<{width}}  {run:>8}  {failed:>8}  {seconds:>7.1f}", flush=True)
        if first is not None:
            found.append(f"{target.name}: {first}")
    for line in found:
        print(f"\n{line}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
