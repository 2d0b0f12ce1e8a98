"""The `lxc` profile's container through the Proxmox API: `lxc_container` (create or converge keys and
`devN` entries), `lxc_raw_lines` (the raw `lxc.*` lines the API cannot write) and `container_driver` (the
container's userspace driver equals the host's kernel module). Starting and parking it are
pvegpu/operations/pve_guest.py's, with `CT`.

Reads happen while preparing, writes are function commands (API) or shell commands (the config file), so
`--dry` reads but never writes.
"""

from __future__ import annotations

import shlex
from collections.abc import Generator, Mapping, Sequence

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.local.create_records import CreateLedger
from pvegpu.operations.pve_guest import Guest, Ownership, converge
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import (
    ContainerChange,
    ContainerPlan,
    diff_container,
    raw_line_problem,
    raw_of,
    version_drift,
)

LXC_CONF = "/etc/pve/lxc/{vmid}.conf"


@operation()
def lxc_container(
    *,
    guest: Guest,
    container: ContainerPlan,
    timeout_s: float,
    ledger: CreateLedger | None = None,
    ownership: Ownership | None = None,
) -> Generator[FunctionCommand, None, None]:
    """Create container `guest` with the plan's `config` + `create` (plan/lxc.py `ContainerPlan`:
    `created_with`) when absent, else PUT the keys that differ and delete the `devN` entries not in `config`
    (with the read's digest); the model store's `mpN` as `diff_container` chooses it (an operator's `mpN`
    kept). `ledger`: pvegpu's records of its creates (`converge`). `ownership`: pvegpu's
    mark (created with it; an existing container without it refused unless `lxc.adopt`)."""
    config, store = container.config, container.store
    devices = sum(1 for key in config if key.startswith("dev"))
    mounted = "" if store is None else f", the model store {store} read-only"

    def diff(current: Mapping[str, object]) -> ContainerChange:
        try:
            return diff_container(config, current, store)
        except PlanError as error:
            raise OperationError(f"CT {guest.vmid}: {error}") from None

    yield from converge(
        guest,
        create=container.created_with,
        diff=diff,
        unchanged=f"CT {guest.vmid} on {guest.node} has its config: {devices} device entries{mounted}",
        timeout_s=timeout_s,
        ledger=ledger,
        ownership=ownership,
    )


@operation()
def lxc_raw_lines(
    *, guest: Guest, wanted: Sequence[tuple[str, str]], replace: str
) -> Generator[StringCommand, None, None]:
    """Give the container's config file each `wanted` raw line its main section lacks (the API's `lxc`
    list), and drop the main section's lines that start with `replace` and are not wanted (pvegpu's
    /dev/shm line of another size). A container not created yet has none. Noop when all are there.

    The edit (`raw_lines_command`) runs on the node under pve-container's own lock and decides again from
    the file it locked: lines go at the end of the main section (before `[pve:pending]` or a snapshot's
    `[name]`, where pve-container writes raw lines); pending and snapshot sections are kept byte for byte.
    Refused before anything is written (OperationError): a line `raw_line_problem` refuses, or a
    `replace` with a control character.
    """
    for key, value in wanted:
        problem = raw_line_problem(key, value)
        if problem is not None:
            raise OperationError(f"CT {guest.vmid}: {problem}")
    if not replace or any(ord(c) < 0x20 or ord(c) == 0x7F for c in replace):
        raise OperationError(
            f"CT {guest.vmid}: raw lxc prefix {replace!r} is empty or has a control character"
        )
    config = guest.config_or_none()
    current = () if config is None else raw_of(config.values)
    path = LXC_CONF.format(vmid=int(guest.vmid))
    stale = [f"{k}: {v}" for k, v in current if f"{k}: {v}".startswith(replace) and (k, v) not in wanted]
    missing = [f"{k}: {v}" for k, v in wanted if (k, v) not in current]
    if not stale and not missing:
        host.noop(f"{path} has its {len(wanted)} raw lxc lines")
        return
    yield StringCommand(raw_lines_command(int(guest.vmid), [f"{k}: {v}" for k, v in wanted], replace))


# pve-container's lock: PVE::LXC::Config `config_file_lock` (/run/lock/lxc, made at load), taken by
# AbstractConfig `lock_config` as PVE::Tools `lock_file_full` does: flock(LOCK_EX) on the file opened for
# append, 10 s by default.
LXC_LOCK_DIR = "/run/lock/lxc"
LOCK_TIMEOUT_S = 10

# The main section of a pve-container config ends at its first `[...]` line (`[pve:pending]`, `[snap]`).
# Raw lines compare as pve-container parses them (`key: value` or `key = value`, blanks trimmed). Lines not
# wanted that start with PVEGPU_DROP go; wanted lines missing go after the main section's last line (its
# blank lines stay before the next section, as write_pct_config puts one there). `lock:` in the main
# section (a snapshot or backup in progress) refuses, as the API's check_lock does.
_RAW_AWK = r"""
function norm(line,   key, rest) {
  if (!match(line, /^lxc\.[a-z0-9_.-]+/)) return ""
  key = substr(line, 1, RLENGTH); rest = substr(line, RLENGTH + 1)
  if (rest !~ /^(:|[ 	]*=)/) return ""
  sub(/^(:|[ 	]*=)[ 	]*/, "", rest); sub(/[ 	]+$/, "", rest)
  return key ": " rest
}
function flush(   i) {
  for (i = 1; i <= n; i++) if (!(add[i] in seen)) print add[i]
  for (i = 1; i <= held; i++) print hold[i]
  held = 0; main = 0
}
BEGIN {
  n = split(ENVIRON["PVEGPU_ADD"], add, "	")
  for (i = 1; i <= n; i++) want[add[i]] = 1
  drop = ENVIRON["PVEGPU_DROP"]; main = 1
}
main && /^\[/ { flush() }
!main { print; next }
/^[ 	]*$/ { hold[++held] = $0; next }
{ for (i = 1; i <= held; i++) print hold[i]; held = 0 }
/^lock:/ { locked = $0; sub(/^lock:[ 	]*/, "", locked) }
{ line = norm($0) }
line != "" && drop != "" && index(line, drop) == 1 && !(line in want) { next }
line != "" { seen[line] = 1 }
{ print }
END {
  if (main) flush()
  if (locked != "") {
    printf "CT %s is locked (%s): raw lxc lines not written\n", ENVIRON["PVEGPU_CT"], locked > "/dev/stderr"
    exit 1
  }
}
"""


def raw_lines_command(vmid: int, wanted: Sequence[str], drop: str) -> str:
    """The node's shell edit of `/etc/pve/lxc/<vmid>.conf` (lxc_raw_lines): `wanted` whole lines
    (`key: value`, checked: no control character), `drop` the prefix of pvegpu's lines to replace. Under
    the CT's config lock, the file is rewritten through a temporary file in its own directory and renamed
    over it (as PVE::Tools file_set_contents does), only when the edit changes it. Fails in one line: the
    lock not had in 10 s, no such config, the CT locked."""
    path = LXC_CONF.format(vmid=vmid)
    lock = f"{LXC_LOCK_DIR}/pve-config-{vmid}.lock"
    env = f"PVEGPU_CT={vmid} PVEGPU_ADD={shlex.quote(chr(9).join(wanted))} PVEGPU_DROP={shlex.quote(drop)}"
    lines = [
        f"mkdir -p {LXC_LOCK_DIR} && (",
        f"flock -w {LOCK_TIMEOUT_S} 9 || {{ echo \"can't lock file '{lock}' - got timeout\" >&2; exit 1; }}",
        f'f={shlex.quote(path)}; t="$f.tmp.$$"',
        f'[ -f "$f" ] || {{ echo "CT {vmid}: $f does not exist: raw lxc lines not written" >&2; exit 1; }}',
        f'{env} awk {shlex.quote(_RAW_AWK.strip())} "$f" > "$t" || {{ rm -f "$t"; exit 1; }}',
        'if cmp -s "$f" "$t"; then rm -f "$t"; else mv -f "$t" "$f"; fi',
        f") 9>>{lock}",
    ]
    return "\n".join(lines)


@operation()
def container_driver(
    *, vmid: int, host_module: str | None, container_userspace: str | None
) -> Generator[StringCommand, None, None]:
    """The drift check, every run: noop when container `vmid`'s userspace driver equals the host's kernel
    module; fail with both versions when they differ (`pvegpu.plan.lxc.version_drift`); a side without a
    driver yet (the first deploy) is a warning: nothing to compare."""
    problem = version_drift(host_module, container_userspace)
    if problem is None:
        host.noop(f"CT {vmid}: userspace driver {container_userspace} equals the host kernel module")
    elif host_module is not None and container_userspace is not None:
        raise OperationError(f"CT {vmid}: {problem}")
    else:
        logger.warning(f"{host.print_prefix}CT {vmid}: {problem}")
        host.noop(f"CT {vmid}: driver versions not compared: {problem}")
    yield from ()
