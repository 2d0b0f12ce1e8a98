"""STAND-IN `python -m sglang.benchmark.serving` (pvegpu lab): the real tool's options that pvegpu passes,
requests against the server's /v1/chat/completions, and one JSON line of the real tool's result keys.

Packaged by `lab.guest_payload` as `sglang/benchmark/serving.py` of the stand-in wheel; standard library only.
It sends `--num-prompts` chat requests, at most `--max-concurrency` at a time, and appends to `--output-file`
one JSON object with `backend`, `max_concurrency`, `completed`, `duration`, `request_throughput`,
`output_throughput`, `mean_ttft_ms`, `median_ttft_ms`, `p99_ttft_ms`, `mean_itl_ms`, `median_itl_ms`,
`random_input_len`, `random_output_len`, `accept_length` (read from the server's `/server_info`
`internal_states[0].avg_spec_accept_length`, as the real tool reads it; None without one), `stand_in` (true).
TTFT is the whole request time (the stand-in does not stream); ITL spreads it over the tokens. The key comes
from OPENAI_API_KEY, as the real tool reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang.benchmark.serving")
    parser.add_argument("--backend", default="sglang")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--dataset-name", default="sharegpt", choices=["sharegpt", "random", "random-ids"])
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=1024)
    parser.add_argument("--output-file", required=True)
    parser.add_argument("--seed", type=int, default=1)
    return parser


def _one(base_url: str, model: str | None, key: str | None) -> tuple[float, int]:
    body = {"model": model or "default", "messages": [{"role": "user", "content": "benchmark"}]}
    request = urllib.request.Request(f"{base_url}/v1/chat/completions", data=json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as response:
        tokens = int(json.loads(response.read())["usage"]["completion_tokens"])
    return time.monotonic() - started, tokens


def _accept_length(base_url: str, key: str | None) -> float | None:
    request = urllib.request.Request(f"{base_url}/server_info")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            states = json.loads(response.read()).get("internal_states") or [{}]
    except (OSError, ValueError):
        return None
    value = states[0].get("avg_spec_accept_length")
    return float(value) if isinstance(value, int | float) else None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.dataset_name != "random-ids":
        print("STAND-IN: only --dataset-name random-ids works offline (the others download ShareGPT)")
        return 2
    key = os.environ.get("OPENAI_API_KEY")
    concurrency = args.max_concurrency or args.num_prompts
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda _: _one(args.base_url, args.model, key), range(args.num_prompts)))
    duration = time.monotonic() - started
    ttft = sorted(seconds * 1000 for seconds, _ in results)
    tokens = sum(count for _, count in results)
    itl = [seconds * 1000 / max(count, 1) for seconds, count in results]
    record = {
        "backend": args.backend,
        "max_concurrency": concurrency,
        "completed": len(results),
        "duration": duration,
        "request_throughput": len(results) / duration,
        "output_throughput": tokens / duration,
        "mean_ttft_ms": statistics.fmean(ttft),
        "median_ttft_ms": statistics.median(ttft),
        "p99_ttft_ms": ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))],
        "mean_itl_ms": statistics.fmean(itl),
        "median_itl_ms": statistics.median(itl),
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "accept_length": _accept_length(args.base_url, key),
        "stand_in": True,
    }
    with open(args.output_file, "a") as out:
        out.write(json.dumps(record) + "\n")
    print("============ Serving Benchmark Result (pvegpu lab STAND-IN) ============")
    print(f"{'Output token throughput (tok/s):':<40} {record['output_throughput']:<10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
