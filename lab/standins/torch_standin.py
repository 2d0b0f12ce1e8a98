"""pvegpu lab STAND-IN for the part of `torch` pvegpu's P2P probe uses (pvegpu/data/p2p/p2p_probe.py); no GPU,
no tensor math. Packaged by `lab.guest_payload` as `torch/__init__.py` in the stand-in SGLang wheel (the real
SGLang wheel pulls in torch). Standard library only.

What it models, so the probe's real logic runs:
- `torch.cuda.device_count()`: the GPUs the guest's (stand-in) `nvidia-smi` lists, so the driver must be
  installed as for real torch; `can_device_access_peer`, `set_device`, `synchronize`, `Event` (timing on a
  modelled per-device clock: each copy and all-reduce advances it by latency + bytes / bandwidth).
- tensors carry no data but a description of how they were made (`content`): a copy keeps it, arithmetic
  combines it, `sum().item()` is a number derived from it; `full` tensors hold their value, so an
  all-reduce's sum is real.
- `torch.distributed`: `init_process_group` (env:// rendezvous: MASTER_PORT, RANK, WORLD_SIZE) and
  `all_reduce`, the ranks exchanging their values through files; the transport is SHM when
  `NCCL_P2P_DISABLE=1`, else P2P.

The outcome is the lab's choice: the first line of /etc/pvegpu-lab/p2p-outcome (absent: `success`):
`success` (P2P faster than SHM), `hang` (a GPU-to-GPU copy never returns, NVIDIA/nccl #2335),
`checksum A B` (copies from GPU A to GPU B arrive corrupted), `slower` (P2P slower than SHM).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

__version__ = "2.14.1+pvegpulab"
OUTCOME_FILE = "/etc/pvegpu-lab/p2p-outcome"
# (latency s, bandwidth B/s) per transport, and P2P's in the `slower` outcome.
SHM_MODEL = (13e-6, 20e9)
P2P_MODEL = (3e-6, 45e9)
SLOW_P2P_MODEL = (40e-6, 8e9)


def _outcome() -> list[str]:
    try:
        words = Path(OUTCOME_FILE).read_text().split()
    except OSError:
        return ["success"]
    return words or ["success"]


class dtype:  # noqa: N801 - torch's name
    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size

    def __repr__(self) -> str:
        return f"torch.{self.name}"


int32, int64, float32 = dtype("int32", 4), dtype("int64", 8), dtype("float32", 4)
_CLOCK: dict[str, float] = {}
_SERIAL = itertools.count()


def _advance(device: str, nbytes: int, model: tuple[float, float]) -> None:
    latency, bandwidth = model
    _CLOCK[device] = _CLOCK.get(device, 0.0) + latency + nbytes / bandwidth


class Tensor:
    def __init__(self, n: int, kind: dtype, device: str, content: tuple[Any, ...]) -> None:
        self.n, self.dtype, self.device, self.content = n, kind, device, content

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return self.dtype.size

    def to(self, target: dtype | str) -> Tensor:
        if isinstance(target, dtype):
            return Tensor(self.n, target, self.device, self.content)
        if target == self.device:
            return self
        outcome = _outcome()
        source, to = int(self.device.split(":")[1]), int(target.split(":")[1])
        if outcome[0] == "hang":
            while True:  # the copy never completes, as a broken peer mapping does
                time.sleep(3600)
        content = self.content
        if outcome[0] == "checksum" and [source, to] == [int(word) for word in outcome[1:3]]:
            content = ("corrupted", content)
        _advance(self.device, self.n * self.dtype.size, _p2p_model())
        return Tensor(self.n, self.dtype, target, content)

    def __mul__(self, other: Tensor) -> Tensor:
        return Tensor(self.n, self.dtype, self.device, ("mul", self.content, other.content))

    __hash__ = None  # type: ignore[assignment]  # as torch's: tensors compare elementwise

    def __eq__(self, value: object) -> Tensor:  # type: ignore[override]
        same = self.content[0] == "full" and self.content[1] == value
        return Tensor(self.n, _bool, self.device, ("full", same))

    def all(self) -> Tensor:
        return Tensor(1, _bool, self.device, self.content)

    def sum(self) -> Tensor:
        if self.content[0] == "full":
            return Tensor(1, self.dtype, self.device, ("full", self.content[1] * self.n))
        return Tensor(1, self.dtype, self.device, ("sum", self.content))

    def item(self) -> Any:
        if self.content[0] == "full":
            return self.content[1]
        return int.from_bytes(hashlib.sha256(repr(self.content).encode()).digest()[:8], "little")


_bool = dtype("bool", 1)


def _p2p_model() -> tuple[float, float]:
    return SLOW_P2P_MODEL if _outcome()[0] == "slower" else P2P_MODEL


def randint(low: int, high: int, size: tuple[int, ...], *, dtype: dtype, device: str) -> Tensor:
    return Tensor(size[0], dtype, device, ("randint", low, high, os.getpid(), next(_SERIAL)))


def arange(start: int, end: int, *, dtype: dtype, device: str) -> Tensor:
    return Tensor(end - start, dtype, device, ("arange", start, end))


def full(size: tuple[int, ...], value: float, *, dtype: dtype, device: str) -> Tensor:
    return Tensor(size[0], dtype, device, ("full", value))


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.timing, self.at = enable_timing, 0.0

    def record(self) -> None:
        self.at = _CLOCK.get(f"cuda:{cuda.current}", 0.0)

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1000


def _device_count() -> int:
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        raise RuntimeError(
            f"STAND-IN torch: no CUDA driver ({listed.stdout.strip() or listed.stderr.strip()})"
        )
    return len(listed.stdout.split())


def _set_device(index: int) -> None:
    cuda.current = index


cuda = types.SimpleNamespace(
    current=0,
    device_count=_device_count,
    can_device_access_peer=lambda a, b: a != b,
    set_device=_set_device,
    synchronize=lambda device=None: device and None,  # every modelled operation completes at once
    Event=_Event,
)


class _Group:
    rank = 0
    world = 1
    folder = Path()
    calls = 0


def _init_process_group(backend: str, rank: int, world_size: int) -> None:
    if backend != "nccl":
        raise ValueError(f"STAND-IN torch.distributed: only the nccl backend is modelled, not {backend}")
    _Group.rank, _Group.world = rank, world_size
    _Group.folder = Path(tempfile.gettempdir()) / f"pvegpu-lab-torch-{os.environ['MASTER_PORT']}"
    _Group.folder.mkdir(exist_ok=True)


def _all_reduce(tensor: Tensor) -> None:
    if tensor.content[0] != "full":
        raise ValueError("STAND-IN torch.distributed: all_reduce models tensors made by torch.full only")
    call = _Group.calls
    _Group.calls += 1
    mine = _Group.folder / f"{call}-{_Group.rank}"
    mine.with_suffix(".partial").write_text(json.dumps(tensor.content[1]))
    mine.with_suffix(".partial").rename(mine)
    total = 0.0
    for rank in range(_Group.world):
        path = _Group.folder / f"{call}-{rank}"
        while not path.exists():
            time.sleep(0.001)
        total += json.loads(path.read_text())
    tensor.content = ("full", total)
    shm = os.environ.get("NCCL_P2P_DISABLE") == "1"
    _advance(tensor.device, tensor.n * tensor.dtype.size, SHM_MODEL if shm else _p2p_model())


distributed = types.ModuleType(f"{__name__}.distributed")
distributed.init_process_group = _init_process_group  # type: ignore[attr-defined]
distributed.all_reduce = _all_reduce  # type: ignore[attr-defined]
distributed.destroy_process_group = lambda: None  # type: ignore[attr-defined]
sys.modules[distributed.__name__] = distributed
