"""The P2P probe's record as the guest keeps it (`RECORD_PATH`, `vm.p2p: probe`, pvegpu/plan/p2p.py): the
mode it was made for, the verdict and what the verdict depends on. Plain frozen data; pvegpu writes it
(`Record.text`), `pvegpu.facts.p2p_record.parse_record` reads it back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

P2pMode = Literal["off", "probe", "on"]
Verdict = Literal["p2p", "shm"]

RECORD_PATH = "/var/lib/pvegpu/p2p-probe.json"


@dataclass(frozen=True)
class Identity:
    """What a probe's verdict depends on: the guest's NVIDIA driver and kernel, and the VM's GPUs (its
    hostpciN values and the clique parts that were probed)."""

    driver: str
    kernel: str
    devices: str

    def as_json(self) -> dict[str, str]:
        return {"driver": self.driver, "kernel": self.kernel, "devices": self.devices}


@dataclass(frozen=True)
class Record:
    """The verdict recorded on the guest (`RECORD_PATH`): the mode it was made for, the verdict, what it
    depends on, the failures and the measured summary."""

    mode: P2pMode
    verdict: Verdict
    identity: Identity
    failures: tuple[str, ...] = ()
    summary: str = ""

    def text(self) -> str:
        body = {
            "mode": self.mode,
            "verdict": self.verdict,
            "identity": self.identity.as_json(),
            "failures": list(self.failures),
            "summary": self.summary,
        }
        return json.dumps(body, indent=2, sort_keys=True) + "\n"
