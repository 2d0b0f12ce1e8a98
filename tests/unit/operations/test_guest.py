"""Operations of the guest roles (nvidia_driver, sglang): facts in -> exact commands out, or the noop
sentence, or the error; FunctionCommands run against a fake shell that answers like the host would."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.host_read import HostState
from pvegpu.facts.next_boot import NextBoot
from pvegpu.facts.sglang import Probe, SglangProbe, VenvState
from pvegpu.models.boot import KernelBoot
from pvegpu.models.driver import DriverSpec
from pvegpu.models.guest_state import MISSING, PathState
from pvegpu.models.nvidia import LoadedModule, NvidiaGpu, NvidiaSmi
from pvegpu.models.sglang import ProbeTarget
from pvegpu.operations.files import write_file
from pvegpu.operations.nvidia import cuda_repository, driver_module, driver_verified
from pvegpu.operations.reboot import REBOOT
from pvegpu.operations.sglang import (
    MASK_SCRIPT,
    MASKED,
    journal_command,
    sglang_ready,
    sglang_venv,
)
from tests.unit.host_states import decide_from, host_state
from tests.unit.op_harness import run_op

LIST = "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"
LINE = "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] file:/srv/pvegpu-lab/apt/ /\n"
KEYRING_URL = "file:/srv/pvegpu-lab/apt/cuda-keyring_1.1-1_all.deb"
DRIVER = DriverSpec()
OPEN_580 = LoadedModule("open", "580.95.05")
# Synthesized in nvidia-smi's `--query-gpu=... --format=csv,noheader` shape.
EIGHT = NvidiaSmi(
    tuple(
        NvidiaGpu(i, "NVIDIA RTX PRO 6000 Blackwell Server Edition", f"00000000:0{i + 1}:00.0", "580.95.05")
        for i in range(8)
    ),
    None,
)
OPEN_580_FILE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (x)"


@dataclass
class _Output:
    stdout_lines: list[str]


class FakeShell:
    """A host for FunctionCommands: answers each command from `answers` (first matching substring), and
    each fact read from `facts` (recorded in `read`)."""

    def __init__(self, answers: Mapping[str, list[str]], facts: Mapping[type, object] | None = None) -> None:
        self.answers = answers
        self.facts = facts or {}
        self.ran: list[str] = []
        self.failed: list[str] = []
        self.read: list[tuple[str, dict[str, Any]]] = []

    def get_fact(self, fact: type, **kwargs: Any) -> object:
        self.read.append((fact.__name__, kwargs))
        return self.facts[fact]

    def log_styled(self, message: str, **_kwargs: object) -> None:
        """How a failing command fails its host: one logged line (pvegpu.operations.api_command)."""
        self.failed.append(message)

    def run_shell_command(self, command: StringCommand, print_output: bool = False) -> tuple[bool, _Output]:
        del print_output
        line = command.get_raw_value()
        self.ran.append(line)
        return True, _Output(next((out for key, out in self.answers.items() if key in line), []))

    # The reboot wait reconnects; this host is back at once.
    connected = True

    def connect(self, show_errors: bool = True) -> None:
        del show_errors
        self.ran.append("<connect>")

    def disconnect(self) -> None:
        self.ran.append("<disconnect>")


def call(command: object, shell: FakeShell) -> None:
    assert isinstance(command, FunctionCommand)
    function: Callable[..., bool] = command.function
    if function(None, shell) is False:  # the host failed in one line: its error, as pyinfra would stop
        raise OperationError(shell.failed[-1])


# --- cuda_repository --------------------------------------------------------------------------


KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"


def _file(content: str) -> PathState:
    return PathState("file", "644", "root", "root", hashlib.sha256(content.encode()).hexdigest())


def repository(
    monkeypatch: pytest.MonkeyPatch, keyring: PathState, listed: PathState
) -> tuple[list[Any], list[str]]:
    decide_from(monkeypatch, host_state(paths={KEYRING: keyring, LIST: listed}))
    return run_op(cuda_repository, {}, source_line=LINE, list_path=LIST, keyring_url=KEYRING_URL)


def test_create_repository_fetches_keyring_writes_list_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    commands, noops = repository(monkeypatch, MISSING, MISSING)
    assert commands == [
        f"/usr/lib/apt/apt-helper download-file {KEYRING_URL} /tmp/pvegpu-cuda-keyring.deb && "
        "dpkg --force-confold -i /tmp/pvegpu-cuda-keyring.deb && rm -f /tmp/pvegpu-cuda-keyring.deb",
        write_file(LIST, LINE).get_raw_value(),
        "apt-get update -qq",
    ]
    assert noops == []


def test_update_repository_replaces_keyrings_list_with_the_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    nvidia = LINE.replace("file:/srv/pvegpu-lab/apt/", "https://developer.download.nvidia.com/x/")
    commands, _ = repository(monkeypatch, _file("key"), _file(nvidia))
    assert commands == [write_file(LIST, LINE).get_raw_value(), "apt-get update -qq"]


def test_noop_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    commands, noops = repository(monkeypatch, _file("key"), _file(LINE))
    assert (commands, noops) == (
        [],
        [
            f"{LIST} already points apt at file:/srv/pvegpu-lab/apt/ "
            "(key /usr/share/keyrings/cuda-archive-keyring.gpg)"
        ],
    )


# --- driver_module ----------------------------------------------------------------------------


def test_noop_module_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(module=OPEN_580))
    commands, noops = run_op(driver_module, {}, driver=DRIVER, installing=False)
    assert (commands, noops) == ([], ["the open NVIDIA kernel module 580.95.05 is loaded"])


def test_error_module_still_old_after_install_without_allow_reboot(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(module=None))
    commands, _ = run_op(driver_module, {}, driver=DRIVER, installing=True)
    assert commands[0] == "modprobe nvidia 2>/dev/null || true"  # nothing loaded: load the new one
    assert len(commands) == 2
    old = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (x)"
    with pytest.raises(OperationError) as error:
        call(commands[1], FakeShell({"cat": [old]}))
    assert str(error.value) == (
        "the loaded kernel module is the open 580.65.06, not the pinned open 580.95.05: "
        "reboot the host, or set driver.allow_reboot"
    )
    call(commands[1], FakeShell({"cat": [OPEN_580_FILE]}))  # loaded by the install: passes


def test_update_module_reboots_when_still_mismatched_then_verifies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.reboot._DELAY_S", 0.0)
    driver = DriverSpec(allow_reboot=True)
    decide_from(monkeypatch, host_state(module=OPEN_580))
    commands, _ = run_op(driver_module, {}, driver=driver, installing=True)
    old = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (x)"
    # The guest's next kernel (its newest image) has the new module built: the kernel guard lets it reboot.
    kernels = ("6.1.0-28-amd64", "6.1.0-31-amd64")
    boot = KernelBoot(kernels[0], kernels, None, None, dict.fromkeys(kernels, ("580.95.05",)))
    shell = FakeShell({"cat": [old]}, {NextBoot: boot})
    reboot = REBOOT

    def run(command: StringCommand, print_output: bool = False) -> tuple[bool, _Output]:
        if command.get_raw_value() == reboot:
            shell.answers = {"cat": [OPEN_580_FILE]}  # the new module is loaded at boot
        return FakeShell.run_shell_command(shell, command, print_output)

    monkeypatch.setattr(shell, "run_shell_command", run)
    call(commands[0], shell)
    cat = "cat /proc/driver/nvidia/version 2>/dev/null || true"
    assert shell.ran == [cat, REBOOT, "<disconnect>", "<connect>", cat]
    assert shell.read == [("NextBoot", {})]


def test_update_module_reboots_only_when_still_mismatched(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = DriverSpec(allow_reboot=True)
    decide_from(monkeypatch, host_state(module=None))
    commands, _ = run_op(driver_module, {}, driver=driver, installing=True)
    shell = FakeShell({"cat": [OPEN_580_FILE]})
    call(commands[1], shell)
    assert shell.ran == ["cat /proc/driver/nvidia/version 2>/dev/null || true"]  # already loaded: no reboot
    assert REBOOT not in shell.ran


# --- driver_verified --------------------------------------------------------------------------


def test_noop_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(module=OPEN_580, smi=EIGHT))
    commands, noops = run_op(driver_verified, {}, driver=DRIVER, gpu_count=8, installing=False)
    assert (commands, noops) == ([], ["nvidia-smi lists 8 GPUs on the open kernel module 580.95.05"])


def test_error_verified_names_every_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    proprietary = LoadedModule("proprietary", "580.95.05")
    decide_from(monkeypatch, host_state(module=proprietary, smi=NvidiaSmi(EIGHT.gpus[:7], None)))
    with pytest.raises(OperationError) as error:
        run_op(driver_verified, {}, driver=DRIVER, gpu_count=8, installing=False)
    assert str(error.value) == (
        "the loaded kernel module is the proprietary 580.95.05, not the pinned open 580.95.05; "
        "nvidia-smi lists 7 GPUs, expected 8 (node.gpus.count)"
    )


def test_create_verified_checks_on_the_host_after_install() -> None:
    commands, _ = run_op(driver_verified, {}, driver=DRIVER, gpu_count=8, installing=True)
    failing = FakeShell({"cat": [OPEN_580_FILE], "nvidia-smi": ["No devices were found"]})
    with pytest.raises(OperationError) as error:
        call(commands[0], failing)
    assert str(error.value) == "nvidia-smi failed: No devices were found"
    rows = [f"{g.index}, {g.name}, {g.bus_id}, {g.driver_version}" for g in EIGHT.gpus]
    call(commands[0], FakeShell({"cat": [OPEN_580_FILE], "nvidia-smi": rows}))


# --- sglang_venv -------------------------------------------------------------------------------


def venv(
    monkeypatch: pytest.MonkeyPatch, state: VenvState, pip_args: tuple[str, ...] = ()
) -> tuple[list[Any], list[str]]:
    decide_from(monkeypatch, host_state(venvs={"/opt/sglang/venv": state}))
    return run_op(sglang_venv, {}, venv="/opt/sglang/venv", version="0.5.23", pip_args=pip_args)


def test_create_venv_and_install_pinned_from_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    commands, _ = venv(monkeypatch, VenvState(False, None), ("--no-index", "--find-links", "/srv/wheels"))
    assert commands == [
        "python3 -m venv /opt/sglang/venv",
        "/opt/sglang/venv/bin/pip install --disable-pip-version-check --quiet --no-index --find-links "
        "/srv/wheels sglang==0.5.23",
    ]


def test_update_venv_other_version(monkeypatch: pytest.MonkeyPatch) -> None:
    commands, _ = venv(monkeypatch, VenvState(True, "0.5.20"))
    assert commands == ["/opt/sglang/venv/bin/pip install --disable-pip-version-check --quiet sglang==0.5.23"]


def test_noop_venv_local_label_matches_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    assert venv(monkeypatch, VenvState(True, "0.5.23+pvegpulab")) == (
        [],
        ["venv /opt/sglang/venv has sglang 0.5.23+pvegpulab"],
    )


# --- sglang_ready -----------------------------------------------------------------------------

TARGET = ProbeTarget("/opt/sglang/venv/bin/python", "http://127.0.0.1:30000", None)
READY = {"target": TARGET}


def test_noop_ready_from_the_state_read(monkeypatch: pytest.MonkeyPatch) -> None:
    state = replace(host_state(), probe=Probe(True, "glm-5"), probe_target=TARGET)
    monkeypatch.setattr("pvegpu.operations.sglang.unchanged_state", lambda _host: state)
    result = run_op(sglang_ready, {}, **READY, timeout_s=5, starting=False)  # no probe of its own
    assert result == ([], ["sglang.service answers http://127.0.0.1:30000/health and /v1/models (glm-5)"])


@pytest.mark.parametrize(
    "state",
    [
        None,  # something on the host changed since the read
        host_state(),  # the read held no probe
        replace(host_state(), probe=Probe(False, "old"), probe_target=replace(TARGET, base_url="http://h:1")),
    ],
)
def test_noop_ready_probes_when_the_read_did_not(
    monkeypatch: pytest.MonkeyPatch, state: HostState | None
) -> None:
    monkeypatch.setattr("pvegpu.operations.sglang.unchanged_state", lambda _host: state)
    result = run_op(sglang_ready, {SglangProbe: Probe(True, "glm-5")}, **READY, timeout_s=5, starting=False)
    assert result == ([], ["sglang.service answers http://127.0.0.1:30000/health and /v1/models (glm-5)"])


def test_error_not_ready_without_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.sglang.unchanged_state", lambda _host: host_state())
    with pytest.raises(OperationError) as error:
        run_op(sglang_ready, {SglangProbe: Probe(False, "[Errno 111] Connection refused")},
               **READY, timeout_s=5, starting=False)  # fmt: skip
    assert str(error.value) == (
        "sglang.service does not answer at http://127.0.0.1:30000: [Errno 111] Connection refused"
    )


def test_error_start_timeout_shows_journal_tail() -> None:
    commands, _ = run_op(sglang_ready, {}, **READY, timeout_s=0.01, starting=True)
    shell = FakeShell({"journalctl": ["sglang serve: error: model path /m is not a directory"]})
    with pytest.raises(OperationError) as error:
        call(commands[0], shell)
    assert str(error.value) == (
        "sglang.service did not answer http://127.0.0.1:30000/health and /v1/models within 0 s "
        "(last: the probe printed nothing (no Python in the venv?)); its last journal lines:\n"
        "sglang serve: error: model path /m is not a directory"
    )
    assert shell.ran[-1] == (
        "journalctl -u sglang.service -n 20 --no-pager -o cat | /opt/sglang/venv/bin/python -c "
        f"{shlex.quote(MASK_SCRIPT)}"
    )


def test_start_timeout_masks_journal_lines_with_a_key_on_the_host(tmp_path: Path) -> None:
    api_key, admin_key = tmp_path / "api.key", tmp_path / "admin.key"
    api_key.write_text("sk-Plain-42\n")
    admin_key.write_text("sk-Admin-77\n")
    journal = [
        "[2026-12-02 07:00:00] server_args={'model_path': '/m', 'api_key': 'sk-Plain-42', 'port': 30000}",
        "[2026-12-02 07:00:01] ServerArgs(api_key='x', admin_api_key=None)",
        "sglang serve: error: --admin-api-key sk-Admin-77 rejected",
        "[2026-12-02 07:00:02] Load weight end. avail mem=80.00 GB",
    ]
    target = replace(TARGET, python=sys.executable, key_file=str(api_key))
    commands, _ = run_op(sglang_ready, {}, target=target, timeout_s=0.01, starting=True,
                         key_files=(str(api_key), str(admin_key)))  # fmt: skip
    shell = FakeShell({})
    with pytest.raises(OperationError):
        call(commands[0], shell)
    command = shell.ran[-1]
    assert command == journal_command(sys.executable, (str(api_key), str(admin_key))).get_raw_value()
    assert "sk-" not in command  # the key files' paths travel, never their values
    script = command.partition(" | ")[2]
    shown = subprocess.run(["sh", "-c", script], input="\n".join(journal) + "\n", capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    assert shown.splitlines() == [MASKED, MASKED, MASKED, journal[3]]


def test_start_timeout_hides_the_journal_when_a_key_file_is_unreadable(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone.key")
    script = journal_command(sys.executable, (missing,)).get_raw_value().partition(" | ")[2]
    shown = subprocess.run(["sh", "-c", script], input="server up\n", capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    assert shown == f"(pvegpu: journal not shown: {missing} cannot be read)\n"
