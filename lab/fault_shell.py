#!/usr/bin/python3
"""LAB FAULT INJECTION, not a stand-in: root's login shell on a lab node of the fault tier (lab/faults.py).

sshd runs each command as `<login shell> -c COMMAND`. Without an armed fault, or for a COMMAND the armed
fault's pattern does not match, this is /bin/sh. Otherwise the first armed fault it matches fires once
(lab/faults.py says what each does) and is disarmed.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import resource
import signal
import sys
import time
from pathlib import Path

ARMED = Path("/var/lib/pvegpu-lab/fault/armed")
FIRED = Path("/var/lib/pvegpu-lab/fault/fired")
BIN = "/usr/local/lib/pvegpu-fault/bin"
SSHD_NAMES = ("sshd", "sshd-session", "sshd-auth")  # OpenSSH 9.8+ runs a connection as sshd-session


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[1] == "-c" and ARMED.is_file():
        lines = ARMED.read_text().split("\n")
        armed = [lines[at : at + 3] for at in range(0, len(lines) - 2, 3)]
        hit = next((block for block in armed if fnmatch.fnmatchcase(argv[2], block[1])), None)
        if hit is not None:
            rest = [block for block in armed if block is not hit]
            if rest:
                ARMED.write_text("".join(f"{fault}\n{pattern}\n{arg}\n" for fault, pattern, arg in rest))
            else:
                ARMED.unlink()
            fault, _, arg = hit
            fired = _fire(fault, arg)
            with FIRED.open("a") as log:
                log.write(f"{fired}\n")
            if fault in ("cut", "freeze"):
                sys.exit(255)
    os.execv("/bin/sh", ["sh", *argv[1:]])


def _fire(fault: str, arg: str) -> str:
    """Fire `fault`; what it did, for FIRED."""
    if fault == "cut":
        return f"cut (sshd processes killed: {_cut_connection()})"
    if fault == "freeze":
        return f"freeze (sshd processes stopped {arg} s, then killed: {_cut_connection(float(arg))})"
    if fault == "link-down":
        _link_down(float(arg))
    elif fault == "cut-others":
        return f"cut-others (sshd processes killed: {_cut_others()})"
    if fault == "kill-at-rename":
        os.environ["PVEGPU_FAULT_RENAME"] = arg
        os.environ["PATH"] = f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    elif fault == "disk-full":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ignored stays ignored across exec: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(arg), int(arg)))
    return fault


def _link_down(seconds: float) -> None:
    """Take the node's link (eth0) down now and up again after `seconds`, from a detached process (the
    command goes on; what it sends waits in TCP until the link is back)."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for fd in range(3):
                os.dup2(os.open(os.devnull, os.O_RDWR), fd)
            os.system(f"ip link set eth0 down; sleep {seconds}; ip link set eth0 up")
        os._exit(0)
    os.wait()


def _cut_others() -> int:
    """SIGKILL every sshd process that serves another connection than this session's (pyinfra's, when this
    is the API's): each sshd whose parent is an sshd, but none of this session's nor below them."""
    ours = set(_serving())
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        chain = _chain(int(entry.name))
        names = [name for _, name in chain]
        if len(chain) < 2 or names[0] not in SSHD_NAMES or names[1] not in SSHD_NAMES:
            continue
        if ours.isdisjoint(pid for pid, _ in chain):
            os.kill(chain[0][0], signal.SIGKILL)
            killed += 1
    return killed


def _chain(pid: int) -> list[tuple[int, str]]:
    """`pid` and its ancestors below init, with their names (empty when one of them is gone)."""
    chain = []
    while pid > 1:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            return []
        fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
        chain.append((pid, fields["Name"].strip()))
        pid = int(fields["PPid"])
    return chain


def _serving() -> list[int]:
    """The sshd processes serving this session: this process's ancestors whose parent is an sshd too."""
    chain = _chain(os.getppid())
    return [
        pid
        for (pid, name), (_, parent) in itertools.pairwise(chain)
        if name in SSHD_NAMES and parent in SSHD_NAMES
    ]


def _cut_connection(frozen_s: float = 0) -> int:
    """SIGKILL every sshd process serving this session: those among this process's ancestors whose parent is
    an sshd too (the listener, whose parent is not, stays: new connections are taken); with `frozen_s`, they
    are stopped (SIGSTOP) that long first, as a hung peer. Returns how many."""
    serving = _serving()
    if frozen_s:
        for pid in serving:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(frozen_s)
    for pid in serving:
        os.kill(pid, signal.SIGKILL)
    return len(serving)


if __name__ == "__main__":
    main(sys.argv)
