#!/usr/bin/python3
"""LAB FAULT INJECTION, not a stand-in: root's login shell on a lab node of the fault tier (lab/faults.py).

sshd runs each command as `<login shell> -c COMMAND`. Without an armed fault, or for a COMMAND the armed
fault's pattern does not match, this is /bin/sh. Otherwise the fault fires once (lab/faults.py says what
each does) and is disarmed.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import resource
import signal
import sys
from pathlib import Path

ARMED = Path("/var/lib/pvegpu-lab/fault/armed")
FIRED = Path("/var/lib/pvegpu-lab/fault/fired")
BIN = "/usr/local/lib/pvegpu-fault/bin"
SSHD_NAMES = ("sshd", "sshd-session", "sshd-auth")  # OpenSSH 9.8+ runs a connection as sshd-session


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[1] == "-c" and ARMED.is_file():
        fault, pattern, arg = ARMED.read_text().split("\n")[:3]
        if fnmatch.fnmatchcase(argv[2], pattern):
            ARMED.unlink()
            fired = _fire(fault, arg)
            with FIRED.open("a") as log:
                log.write(f"{fired}\n")
            if fault == "cut":
                sys.exit(255)
    os.execv("/bin/sh", ["sh", *argv[1:]])


def _fire(fault: str, arg: str) -> str:
    """Fire `fault`; what it did, for FIRED."""
    if fault == "cut":
        return f"cut (sshd processes killed: {_cut_connection()})"
    if fault == "kill-at-rename":
        os.environ["PVEGPU_FAULT_RENAME"] = arg
        os.environ["PATH"] = f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    elif fault == "disk-full":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ignored stays ignored across exec: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(arg), int(arg)))
    return fault


def _cut_connection() -> int:
    """SIGKILL every sshd process serving this session: those among this process's ancestors whose parent is
    an sshd too (the listener, whose parent is not, stays: new connections are taken). Returns how many."""
    chain = []
    pid = os.getppid()
    while pid > 1:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
        chain.append((pid, fields["Name"].strip()))
        pid = int(fields["PPid"])
    serving = [
        pid
        for (pid, name), (_, parent) in itertools.pairwise(chain)
        if name in SSHD_NAMES and parent in SSHD_NAMES
    ]
    for pid in serving:
        os.kill(pid, signal.SIGKILL)
    return len(serving)


if __name__ == "__main__":
    main(sys.argv)
