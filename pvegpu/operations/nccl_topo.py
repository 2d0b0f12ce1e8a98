"""`nccl_topo_file`: the guest's NCCL topology file (pvegpu/plan/nccl_topo.py) at `/etc/pvegpu/nccl-topo.xml`.

Compared by sha256 with what is there; written atomically (`pvegpu.operations.files.write_file`) when it
differs, 0644 (NCCL reads it as the service's user), so SGLang restarts only when the host's layout changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.operations.files import write_file
from pvegpu.plan.nccl_topo import TOPO_FILE
from pvegpu.run.host_state import state_of


@operation()
def nccl_topo_file(*, content: str, path: str = TOPO_FILE) -> Generator[StringCommand]:
    """`content` at `path` (its directory must exist); noop when the file already has it."""
    if state_of(host).path(path).sha256 == hashlib.sha256(content.encode()).hexdigest():
        host.noop(f"{path} already describes the host's GPU layout")
        return
    yield write_file(path, content)
