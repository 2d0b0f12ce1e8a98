"""LAB FAULT INJECTION, not a stand-in: faults at named points of a run against a lab node.

`install(host)` makes the lab's fault shell (lab/fault_shell.py) root's login shell on `host`. sshd runs every
command of a session as `<login shell> -c COMMAND`, so the fault shell sees each command pyinfra sends, as
sent. Unarmed, or for any other command, it is /bin/sh. `arm(host, fault, pattern, arg)` arms one fault,
which fires once, on the first command matching `pattern` (an fnmatch pattern for the whole command, e.g.
`sh -c update-grub`), and is disarmed then; faults armed one after the other wait side by side:

- `cut`: the SSH connection is cut before the command runs: every sshd process serving the connection is
  killed (SIGKILL), as a network or power loss ends it; the client sees its connection dropped.
- `kill-at-rename`: the command runs; the first `mv` any of its processes runs with an argument ending in
  `arg` kills (SIGKILL) the process that called it: a writer or tool killed with its output staged, not
  renamed into place.
- `disk-full`: the command runs under RLIMIT_FSIZE `arg` bytes, SIGXFSZ ignored: a write past `arg` bytes of
  a file fails with EFBIG, as on a full disk, after the bytes before it landed.
- `freeze`: as `cut`, but the sshd processes are stopped (SIGSTOP) `arg` seconds first: a peer that hangs,
  then goes away. The command does not run.
- `cut-others`: every other SSH connection to the node is cut (their sshd processes killed), then the
  command runs: pyinfra's connection dies under an operation that talks to the API over its own.
- `link-down`: the node's link (eth0) goes down for `arg` seconds, from a detached process, and the command
  runs (its output waits in TCP); new connections fail meanwhile. `netns` hosts only (an nspawn container
  may not change its link).

Each fault that fires appends `<fault>` to FIRED on the node.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from lab.hosts import LabHost

Fault = Literal["cut", "kill-at-rename", "disk-full", "freeze", "cut-others", "link-down"]
FAULTS: tuple[Fault, ...] = ("cut", "kill-at-rename", "disk-full", "freeze", "cut-others", "link-down")
# On the node (its root's overlay, so this machine writes it directly, in both host modes).
STATE = "/var/lib/pvegpu-lab/fault"
ARMED = f"{STATE}/armed"
FIRED = f"{STATE}/fired"
SHELL = "/usr/local/lib/pvegpu-fault/shell"
BIN = "/usr/local/lib/pvegpu-fault/bin"
_SOURCE = Path(__file__).with_name("fault_shell.py")
# Ahead of /bin/mv on the PATH of a command under `kill-at-rename`.
_MV = """#!/bin/sh
# LAB FAULT INJECTION (lab/faults.py), not a stand-in: `mv` for a command under the kill-at-rename fault.
for arg; do
    case "$arg" in
    *"$PVEGPU_FAULT_RENAME") kill -9 "$PPID"; exit 137 ;;
    esac
done
exec /bin/mv "$@"
"""


def install(host: LabHost) -> None:
    """Make the fault shell root's login shell on `host` (nothing armed)."""
    shell = _on(host, SHELL)
    shell.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_SOURCE, shell)
    shell.chmod(0o755)
    mv = _on(host, f"{BIN}/mv")
    mv.parent.mkdir(parents=True, exist_ok=True)
    mv.write_text(_MV)
    mv.chmod(0o755)
    _on(host, STATE).mkdir(parents=True, exist_ok=True)
    passwd = _on(host, "/etc/passwd")
    lines = passwd.read_text().splitlines()
    root = lines[0].split(":")
    if root[0] != "root":
        raise ValueError(f"{host.name}: /etc/passwd does not start with root's line: {lines[0]!r}")
    lines[0] = ":".join([*root[:6], SHELL])
    passwd.write_text("\n".join(lines) + "\n")


def arm(host: LabHost, fault: Fault, pattern: str, arg: str = "") -> None:
    """Arm `fault` for the first command on `host` matching `pattern` (module docstring)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    with _on(host, ARMED).open("a") as armed:
        armed.write(f"{fault}\n{pattern}\n{arg}\n")


def armed(host: LabHost) -> bool:
    """Whether a fault is still armed on `host` (one that fired is not)."""
    return _on(host, ARMED).exists()


def fired(host: LabHost) -> list[str]:
    """The faults that fired on `host`, in order."""
    log = _on(host, FIRED)
    return log.read_text().splitlines() if log.exists() else []


def _on(host: LabHost, path: str) -> Path:
    return host.root / path.lstrip("/")
