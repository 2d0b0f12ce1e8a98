"""pvegpu.run.pyinfra_patches: the same results as the pyinfra functions they replace; paramiko's log (a
failed
handshake's traceback) never on stderr, in pyinfra's debug log instead."""

from __future__ import annotations

import importlib
import inspect
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import arguments, util

from pvegpu.run import pyinfra_patches

_SOURCE = Path(__file__).read_text().splitlines()


def _line(text: str) -> int:
    """The number of this file's one line that ends with `text`."""
    (number,) = [n for n, line in enumerate(_SOURCE, start=1) if line.endswith(text)]
    return number


def _from_a_deploy(state: object) -> tuple[list[int], list[int]]:
    def role() -> tuple[list[int], list[int]]:
        return step()  # role

    def step() -> tuple[list[int], list[int]]:
        return pyinfra_patches.order_from_stack(state), util.get_operation_order_from_stack(state)  # type: ignore[arg-type]

    return role()  # deploy


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [__file__, "/no/such/deploy.py", None])
def test_the_order_is_pyinfras(
    monkeypatch: pytest.MonkeyPatch, is_cli: bool, deploy_file: str | None
) -> None:
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=3)
    ours, theirs = _from_a_deploy(state)  # test
    assert ours == theirs
    lines = ours[1:] if is_cli else ours
    if is_cli:
        assert ours[0] == 3  # the deploy file's index
    calls = [_line("# test"), _line("# deploy"), _line("# role"), _line("# type: ignore[arg-type]")]
    if deploy_file is None:  # every frame that is not pyinfra's, ending with the calls in this file
        assert lines[-4:] == calls
    elif deploy_file == __file__:  # from the deploy file's first frame: this test's call
        assert lines == calls
    else:  # a deploy file not on the stack: pyinfra's search ends at its own frame, so no line
        assert lines == []


def _both(*_args: object) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    return pyinfra_patches.call_sites(), [(frame.filename, frame.lineno) for frame in inspect.stack(0)]


def test_call_sites_are_inspects_through_a_call_written_over_lines() -> None:
    """A call spread over lines is at the line where its expression starts, as inspect (so pyinfra) says."""
    ours, theirs = _both(
        1,
        2,
    )  # the call's own line is the one above
    assert ours == theirs
    assert ours[1] == (__file__, _line("ours, theirs = _both("))


def test_the_global_arguments_are_pyinfras() -> None:
    theirs = pyinfra_patches._ORIGINAL_GLOBAL_ARGUMENTS()
    ours = pyinfra_patches.global_arguments()
    assert ours == theirs
    assert ("_sudo", bool) in ours
    ours.clear()  # a caller's list is its own
    assert pyinfra_patches.global_arguments() == theirs


def test_install_is_where_pyinfra_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    operation = importlib.import_module("pyinfra.api.operation")
    facts = importlib.import_module("pyinfra.api.facts")
    monkeypatch.setattr(operation, "get_operation_order_from_stack", util.get_operation_order_from_stack)
    monkeypatch.setattr(arguments, "all_global_arguments", pyinfra_patches._ORIGINAL_GLOBAL_ARGUMENTS)
    monkeypatch.setattr(facts, "all_global_arguments", pyinfra_patches._ORIGINAL_GLOBAL_ARGUMENTS)
    pyinfra_patches.install()
    assert operation.get_operation_order_from_stack is pyinfra_patches.order_from_stack
    assert arguments.all_global_arguments is pyinfra_patches.global_arguments
    assert facts.all_global_arguments is pyinfra_patches.global_arguments


# A server that answers the SSH handshake with no banner, as a node whose link or sshd is not back; paramiko's
# transport thread logs the failure (ERROR, with its traceback) before the caller's connect raises.
_NO_BANNER = """
import socket, sys, threading
import paramiko
from pyinfra import logger
if sys.argv[1] == "routed":
    from pvegpu.run.pyinfra_patches import route_paramiko_log
    route_paramiko_log()
    logger.addHandler(__import__("logging").StreamHandler(sys.stdout))
    logger.setLevel("DEBUG")
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
def serve():
    conn, _ = listener.accept()
    conn.sendall(b"HTTP/1.1 400 Bad Request\\r\\n" * 3)
    while conn.recv(1024):  # until the client gives up
        pass
    conn.close()
threading.Thread(target=serve).start()
try:
    paramiko.SSHClient().connect(
        "127.0.0.1", listener.getsockname()[1], banner_timeout=1, look_for_keys=False, allow_agent=False
    )
except paramiko.SSHException as error:
    print("raised:", error)
for thread in threading.enumerate():
    if thread is not threading.main_thread():
        thread.join(10)
"""


@pytest.mark.parametrize("routed", [False, True], ids=["paramiko-alone", "routed"])
def test_paramiko_handshake_failure_is_not_printed_on_stderr(routed: bool) -> None:
    argv = [sys.executable, "-c", _NO_BANNER, "routed" if routed else "alone"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)

    assert done.stdout.endswith("raised: Error reading SSH protocol banner\n")
    if routed:
        assert done.stderr == ""
        assert "[paramiko.transport] Exception (client): Error reading SSH protocol banner\n" in done.stdout
    else:  # what pyinfra's CLI printed for every reconnect attempt: Python's last-resort handler
        assert done.stderr.startswith("Exception (client): Error reading SSH protocol banner\nTraceback")


def _first_connect(inventory: Path, cwd: Path) -> str:
    """The output of pyinfra's real CLI run in `cwd` (its group data, if any) on `inventory`'s one host, a
    server on loopback that answers the SSH handshake without a banner."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"HTTP/1.1 400 Bad Request\r\n" * 3)
            while connection.recv(1024):
                pass

    threading.Thread(target=serve, daemon=True).start()
    inventory.write_text(
        f"hosts = [('127.0.0.1', {{'ssh_port': {listener.getsockname()[1]}, 'ssh_user': 'root', "
        "'ssh_look_for_keys': False, 'ssh_paramiko_connect_kwargs': {'banner_timeout': 1}})]\n"
    )
    pyinfra_cli = Path(__file__).resolve().parents[3] / ".venv/bin/pyinfra"
    done = subprocess.run(
        [str(pyinfra_cli), "-y", str(inventory), "exec", "--", "true"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    listener.close()
    assert done.returncode != 0
    return done.stdout + done.stderr


def test_a_failed_first_handshake_of_pyinfras_cli_is_its_own_line_not_paramikos_traceback(
    tmp_path: Path,
) -> None:
    """From the repository root pyinfra loads group_data/all.py with the inventory, before it connects:
    paramiko's log is routed then. Elsewhere (no such group data) paramiko's traceback shows."""
    ours = _first_connect(tmp_path / "inventory.py", Path(__file__).resolve().parents[3])
    assert "[127.0.0.1] SSH error (Error reading SSH protocol banner)" in ours
    assert "Traceback" not in ours
    assert "Exception (client)" not in ours
    elsewhere = _first_connect(tmp_path / "inventory.py", tmp_path)
    assert "Exception (client): Error reading SSH protocol banner\nTraceback" in elsewhere
