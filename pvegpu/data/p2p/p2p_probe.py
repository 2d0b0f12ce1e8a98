"""pvegpu's GPU peer-to-peer probe: run in a VM guest by the SGLang venv's Python (its torch), as root.

    python p2p_probe.py identity   # {"driver": <NVIDIA driver version, "" without one>, "kernel": <uname -r>}
    python p2p_probe.py run        # the result (below), one JSON object on stdout

`run` checks, for every pair of the guest's GPUs, that each reports peer access to the other
(`torch.cuda.can_device_access_peer`) and that a checksummed copy each way arrives intact (a position-
weighted sum computed on each GPU), timing it; then, only when every pair passed, an NCCL all-reduce over
all GPUs (one process per GPU, `torch.distributed`), once with P2P allowed (`NCCL_P2P_LEVEL=SYS`) and once
with P2P disabled (SHM), the result checked on every rank and the small-message latency and bus bandwidth
measured with CUDA events. The verdict is pvegpu's (pvegpu/plan/p2p.py `judge`), not this script's.

    {"gpus": N, "driver": ..., "kernel": ...,
     "pairs": [{"a": 0, "b": 1, "peer": {"ab": true, "ba": true}, "copy": {"ab": true, "ba": true},
                "copy_gbs": {"ab": 21.3, "ba": 21.1}}, ...],
     "allreduce": null | {"p2p": {"ranks": [{"rank": 0, "ok": true, ...}], "latency_us": L, "busbw_gbs": B}
                                 | {"error": "..."}, "shm": {...}}}

A hang (NVIDIA/nccl #2335) is bounded by the caller (`timeout` around this script) and, for the ranks, here.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from typing import Any

COPY_ELEMENTS = 16 << 20  # int32: 64 MiB per copy
SMALL_ELEMENTS = 2  # float32: 8 bytes, the latency figure (nccl-tests' smallest size)
LARGE_ELEMENTS = 32 << 20  # float32: 128 MiB, the bandwidth figure
WARMUP, SMALL_ITERS, LARGE_ITERS = 5, 50, 10
RANK_TIMEOUT_S = 120.0
TRANSPORT_ENV = {"p2p": {"NCCL_P2P_LEVEL": "SYS"}, "shm": {"NCCL_P2P_DISABLE": "1"}}


def _torch() -> Any:
    return importlib.import_module("torch")


def identity() -> dict[str, str]:
    """The NVIDIA driver version (nvidia-smi) and the kernel release this guest runs."""
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except OSError:  # no driver installed: no nvidia-smi
        return {"driver": "", "kernel": platform.release()}
    driver = smi.stdout.strip().splitlines()[0].strip() if smi.returncode == 0 and smi.stdout.strip() else ""
    return {"driver": driver, "kernel": platform.release()}


def _checksum(torch: Any, tensor: Any) -> int:
    weights = torch.arange(1, tensor.numel() + 1, dtype=torch.int64, device=tensor.device)
    return int((tensor.to(torch.int64) * weights).sum().item())


def _copy(torch: Any, source: int, target: int) -> tuple[bool, float]:
    """(the copy source -> target arrived intact, its bandwidth in GB/s)."""
    torch.cuda.set_device(source)  # the events below time the source GPU's stream
    data = torch.randint(0, 2**31 - 1, (COPY_ELEMENTS,), dtype=torch.int32, device=f"cuda:{source}")
    expected = _checksum(torch, data)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(source)
    start.record()
    copied = data.to(f"cuda:{target}")
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000
    nbytes = data.numel() * data.element_size()
    return _checksum(torch, copied) == expected, round(nbytes / seconds / 1e9, 2) if seconds > 0 else 0.0


def pairs(torch: Any, count: int) -> list[dict[str, Any]]:
    found = []
    for a in range(count):
        for b in range(a + 1, count):
            can = torch.cuda.can_device_access_peer
            peer = {"ab": can(a, b), "ba": can(b, a)}
            copy, speed = {}, {}
            for key, source, target in (("ab", a, b), ("ba", b, a)):
                copy[key], speed[key] = _copy(torch, source, target) if peer[key] else (False, 0.0)
            found.append({"a": a, "b": b, "peer": peer, "copy": copy, "copy_gbs": speed})
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def allreduce(count: int, transport: str) -> dict[str, Any]:
    """One process per GPU running `rank`; their JSON lines, or an error (a rank that failed or hung)."""
    port = _free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("NCCL_P2P")}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(count)}
    env |= TRANSPORT_ENV[transport]
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "rank"],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(count)
    ]
    deadline = time.monotonic() + RANK_TIMEOUT_S
    results = []
    try:
        for rank, process in enumerate(ranks):
            try:
                out, err = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                return {"error": f"rank {rank} did not finish within {RANK_TIMEOUT_S:g} s (hang)"}
            if process.returncode != 0:
                last = (err.strip().splitlines() or ["no output"])[-1]
                return {"error": f"rank {rank} failed (exit status {process.returncode}): {last}"}
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    return {
        "ranks": results,
        "latency_us": max(result["latency_us"] for result in results),
        "busbw_gbs": min(result["busbw_gbs"] for result in results),
    }


def _timed(torch: Any, dist: Any, tensor: Any, iterations: int) -> float:
    """Seconds per all-reduce of `tensor`, measured with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    end.record()
    end.synchronize()
    seconds: float = start.elapsed_time(end) / 1000 / iterations
    return seconds


def rank() -> dict[str, Any]:
    """One rank: all-reduce each rank's `rank + 1`, check the sum, time small and large messages."""
    torch = _torch()
    dist = importlib.import_module("torch.distributed")
    me, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(me)
    dist.init_process_group("nccl", rank=me, world_size=world)
    device = f"cuda:{me}"
    total = world * (world + 1) / 2
    ok = True
    for elements in (SMALL_ELEMENTS, LARGE_ELEMENTS):
        tensor = torch.full((elements,), float(me + 1), dtype=torch.float32, device=device)
        dist.all_reduce(tensor)
        ok = ok and bool((tensor == total).all().item())
    small = torch.full((SMALL_ELEMENTS,), 1.0, dtype=torch.float32, device=device)
    large = torch.full((LARGE_ELEMENTS,), 1.0, dtype=torch.float32, device=device)
    for _ in range(WARMUP):
        dist.all_reduce(small)
    latency = _timed(torch, dist, small, SMALL_ITERS)
    seconds = _timed(torch, dist, large, LARGE_ITERS)
    nbytes = large.numel() * large.element_size()
    busbw = nbytes / seconds * 2 * (world - 1) / world / 1e9
    dist.destroy_process_group()
    return {"rank": me, "ok": ok, "latency_us": round(latency * 1e6, 2), "busbw_gbs": round(busbw, 2)}


def run() -> dict[str, Any]:
    torch = _torch()
    count = torch.cuda.device_count()
    found = pairs(torch, count)
    passed = bool(found) and all(all(pair["peer"].values()) and all(pair["copy"].values()) for pair in found)
    reduce = {transport: allreduce(count, transport) for transport in ("p2p", "shm")} if passed else None
    return {"gpus": count, **identity(), "pairs": found, "allreduce": reduce}


def main(argv: list[str]) -> int:
    commands = {"identity": identity, "run": run, "rank": rank}
    if len(argv) != 2 or argv[1] not in commands:
        print(f"usage: {argv[0]} identity|run|rank", file=sys.stderr)
        return 2
    print(json.dumps(commands[argv[1]](), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
