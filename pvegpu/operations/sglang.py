"""SGLang operations: the pinned package in its venv and readiness after a start (the model:
`pvegpu.operations.model_fetch`).

The venv decides from the host's one state read (`pvegpu.run.host_state.state_of`); the user,
files, unit and restarts are `pvegpu.operations.from_state`'s.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from pyinfra.api.command import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts.sglang import SglangProbe, VenvState, parse_probe, probe_command
from pvegpu.models.sglang import ProbeTarget
from pvegpu.operations.api_command import api_command
from pvegpu.plan.sglang_service import SERVICE
from pvegpu.run.host_state import state_of, unchanged_state
from pvegpu.run.wait import WaitTimeoutError, wait_until

_POLL_S = 2.0
JOURNAL_LINES = 20
MASKED = "(pvegpu: a line holding a key of the service, not shown)"
# Run on the host by the venv's Python, the journal on stdin and the key files as arguments (their values
# never leave the host): each line holding a key's value, or a set `api_key`/`admin_api_key` of a
# `server_args=` dump, is replaced by MASKED. A key file it cannot read hides the whole journal.
MASK_SCRIPT = (
    "import sys\n"
    "try:\n"
    "    keys = [k for k in (open(p).read().strip() for p in sys.argv[1:]) if k]\n"
    "except OSError as error:\n"
    "    print(f'(pvegpu: journal not shown: {error.filename} cannot be read)')\n"
    "    sys.exit(0)\n"
    "for line in sys.stdin:\n"
    "    line = line.rstrip('\\n')\n"
    '    set_key = "api_key\': \'" in line or "api_key=\'" in line\n'
    f"    print({MASKED!r} if set_key or any(k in line for k in keys) else line)\n"
)


def journal_command(python: str, key_files: Sequence[str]) -> StringCommand:
    """The service's last JOURNAL_LINES journal lines, masked on the host by MASK_SCRIPT."""
    return StringCommand(
        "journalctl", "-u", SERVICE, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat",
        "|", QuoteString(python), "-c", QuoteString(MASK_SCRIPT), *map(QuoteString, key_files),
    )  # fmt: skip


def public_version(version: str) -> str:
    """`0.5.23+pvegpulab` -> `0.5.23` (a local label, as on the lab's stand-in wheel, matches the pin)."""
    return version.partition("+")[0]


@operation()
def sglang_venv(
    *, venv: str, version: str, pip_args: Sequence[str] = ()
) -> Generator[StringCommand, None, None]:
    """A venv at `venv` (`python3 -m venv`) with `sglang==version` (`pip install`, plus `pip_args`)."""
    state = state_of(host).venvs.get(venv, VenvState(python=False, version=None))
    if state.python and state.version is not None and public_version(state.version) == version:
        host.noop(f"venv {venv} has sglang {state.version}")
        return
    if not state.python:
        yield StringCommand("python3", "-m", "venv", QuoteString(venv))
    yield StringCommand(
        QuoteString(f"{venv}/bin/pip"), "install", "--disable-pip-version-check", "--quiet",
        *map(QuoteString, pip_args), QuoteString(f"sglang=={version}"),
    )  # fmt: skip


@operation()
def sglang_ready(
    *, target: ProbeTarget, timeout_s: float, starting: bool, key_files: Sequence[str] | None = None
) -> Generator[FunctionCommand, None, None]:
    """`/health` and `/v1/models` answer at `target.base_url` (on a rank other than 0: `/health` there and at
    rank 0, `target.leader_url`). Not `starting` (nothing changed): checked once,
    noop or fail, from the host's state read when it holds the probe of `target` and nothing on the host
    changed since (else by the probe alone).
    `starting`: polled after the (re)start for up to `timeout_s`; failing names the last error and shows the
    service's last journal lines, each holding a value of `key_files` (default: the probe's key file) masked
    (`journal_command`)."""
    base_url = target.base_url
    if key_files is None:
        key_files = () if target.key_file is None else (target.key_file,)
    if not starting:
        state = unchanged_state(host)
        probe = state.probe if state is not None and state.probe_target == target else None
        if probe is None:
            probe = host.get_fact(
                SglangProbe,
                python=target.python,
                base_url=base_url,
                key_file=target.key_file,
                leader_url=target.leader_url,
            )
        if not probe.ok:
            raise OperationError(f"{SERVICE} does not answer at {base_url}: {probe.detail}")
        host.noop(f"{SERVICE} answers {target.answers} ({probe.detail})")
        return

    def wait() -> None:
        def not_ready() -> str | None:
            _, output = host.run_shell_command(probe_command(target), print_output=False)
            probe = parse_probe(output.stdout_lines)
            return None if probe.ok else probe.detail

        try:
            wait_until(not_ready, timeout_s, f"{SERVICE} does not answer", interval_s=_POLL_S)
        except WaitTimeoutError as timeout:
            _, journal = host.run_shell_command(journal_command(target.python, key_files), print_output=False)
            lines = "\n".join(journal.stdout_lines)
            raise OperationError(
                f"{SERVICE} did not answer {target.answers} within {timeout_s:.0f} s "
                f"(last: {timeout.last}); its last journal lines:\n{lines}"
            ) from None

    yield api_command(wait)  # a service that never answers fails its host in one line (the journal after it)
