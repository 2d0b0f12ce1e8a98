"""The hook's one Proxmox API call, `pvesh set`, bounded in time (Proxmox gives a hook no timeout)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


class PveshError(RuntimeError):
    """`pvesh` failed or did not finish in time; the message is one line: what pvesh said, or the timeout."""


def pvesh_set(path: str, options: Sequence[tuple[str, str]], timeout_s: float, pvesh: str) -> None:
    """`pvesh set PATH --KEY VALUE ...` (a repeated key is given once per value); raises PveshError with
    pvesh's error lines joined (`; `) when it exits non-zero, or when it runs longer than `timeout_s`."""
    argv = [pvesh, "set", path]
    for key, value in options:
        argv += [f"--{key}", value]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise PveshError(f"pvesh set {path} did not finish within {timeout_s:g} s") from None
    except OSError as error:
        raise PveshError(f"pvesh set {path}: {error.strerror or error}") from None
    if done.returncode != 0:
        said = "; ".join(line.strip() for line in done.stderr.splitlines() if line.strip())
        raise PveshError(f"pvesh set {path}: {said or f'exit {done.returncode}'}")
