"""Details the real Proxmox code shows, in pvegpu and in the lab's stand-ins alike:

- a task ending `WARNINGS: N` succeeded (pve-common src/PVE/UPID.pm `status_is_error`);
- `download-url` stores a file under its normalized name (pve-storage src/PVE/Storage.pm
  `normalize_content_filename`), and pvegpu names the volume the same way;
- a VM runs when /var/run/qemu-server/<vmid>.pid holds a bare PID whose process names that pidfile after
  `-pidfile` (qemu-server src/PVE/QemuServer/Helpers.pm `instance_running_locally`): the node's one read
  brings it, so a no-op run asks no `pvesh` for the VM's status;
- the pre-start hook runs under the VM's config lock (qemu-server src/PVE/QemuServer.pm `vm_start`:
  `lock_config` around `vm_start_nolock`, which runs the hook).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import fakesys
from lab.pve.pvelib.api.nodes_tasks import get_task_status
from lab.pve.pvelib.hypervisor import qemu_running_pid
from lab.pve.pvelib.rest import Call
from lab.pve.pvelib.settings import Settings
from lab.pve.pvelib.tasks import run_task, task_log_path
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.node_read import parse_qemu_processes, qemu_processes_command
from pvegpu.facts.pve_files import qemu_running, qemu_status_answer
from pvegpu.models.pve import QemuProcess, TaskStatus, status_is_error
from pvegpu.models.vm import ImageUrl, VmSpec, normalized_file_name
from pvegpu.plan.cloud_init import image_volid
from pvegpu.pve.client import PveClient
from pvegpu.pve.host_client import seed_status, shared_reads
from pvegpu.pve.transport import Method, Params
from tests.unit.lab.pve.test_pvesh import GPU0, GPU1, NODE, REFERENCE, VM_ARGS, Pve, Result
from tests.unit.lab.pve.test_pvesh_cloudimage import Hypervisor
from tests.unit.lab.pve.test_pvesh_hookscript import HOOK, hook, task_log
from tests.unit.lab.pve.test_pvesh_hookscript import pve as pve  # noqa: PLC0414 (the fixture)

PIDFILE = "/var/run/qemu-server/100.pid"
SHA512 = "0" * 128

# --- task exit status ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exitstatus", "error"),
    [
        ("OK", False),
        ("WARNINGS: 1", False),
        ("WARNINGS: 12", False),
        ("WARNINGS: ", True),
        ("WARNINGS: 1 x", True),
        ("unexpected status", True),
        ("command 'qm start' failed", True),
        (None, True),
    ],
)
def test_status_is_error_as_upid_pm(exitstatus: str | None, error: bool) -> None:
    assert status_is_error(exitstatus) is error
    assert TaskStatus("UPID:x", "stopped", exitstatus).ok is not error


def test_stand_in_task_that_warned_ends_with_warnings_and_reads_back_so(tmp_path: Path) -> None:
    settings = Settings("pve1", tmp_path / "sys", tmp_path, None, 1.0, "9.0.3", "9.0")
    (tmp_path / "var/log/pve/tasks").mkdir(parents=True)

    def worker(emit: Any) -> None:
        emit("WARN: first")
        emit("still working")
        emit("WARN: second")

    upid = run_task(Call(settings, {}, {}), "qmstart", "100", worker)
    status = get_task_status(Call(settings, {"upid": upid}, {}))
    log = task_log_path(settings, upid, upid.split(":")[4]).read_text()
    assert (status["status"], status["exitstatus"]) == ("stopped", "WARNINGS: 2")
    assert log == "WARN: first\nstill working\nWARN: second\nTASK WARNINGS: 2\n"
    assert (tmp_path / "var/log/pve/tasks/index").read_text().endswith(" WARNINGS: 2\n")


# --- download-url's file name ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("debian-12-genericcloud-amd64.qcow2", "debian-12-genericcloud-amd64.qcow2"),
        ("noble+server=cloudimg~amd64.qcow2", "noble_server_cloudimg_amd64.qcow2"),
        ("a%20b.raw", "a_20b.raw"),
        ("dir/sub\\x y.vmdk", "x_y.vmdk"),
        ("ümlaut.qcow2\n", "_mlaut.qcow2"),
    ],
)
def test_volume_name_is_the_one_download_url_stores(name: str, stored: str) -> None:
    assert normalized_file_name(name) == stored


def test_image_volid_of_a_url_whose_name_download_url_changes() -> None:
    url = ImageUrl(url="https://cloud.example/noble+1.qcow2", checksum=SHA512)
    named = ImageUrl(url="https://cloud.example/x.img", checksum=SHA512, file_name="my=img.qcow2")
    assert image_volid(VmSpec(vmid=100, image=url)) == "local:import/noble_1.qcow2"
    assert image_volid(VmSpec(vmid=100, image=named)) == "local:import/my_img.qcow2"


# --- the VM's QEMU process ----------------------------------------------------------------------------

# qemu-server's own regression output (src/test/cfg2cmd/simple1.conf.cmd), its first options, NUL-joined.
REAL_ARGV = [
    "/usr/bin/kvm",
    "-id",
    "100",
    "-name",
    "simple",
    "-no-shutdown",
    "-pidfile",
    PIDFILE,
    "-daemonize",
]


def cmdline(argv: list[str]) -> bytes:
    return b"\0".join(arg.encode() for arg in argv) + b"\0"


@pytest.mark.parametrize(
    ("process", "running"),
    [
        (QemuProcess(b"4242", cmdline(REAL_ARGV), "S"), True),
        (QemuProcess(b"4242", cmdline(["qemu-system-x86_64", "-pidfile", PIDFILE]), "R"), True),
        (QemuProcess(None, None, None), False),  # no pidfile
        (QemuProcess(b"4242", None, None), False),  # no such process
        (QemuProcess(b"4242", cmdline(REAL_ARGV), "Z"), False),  # a zombie
        (QemuProcess(b" 4242", cmdline(REAL_ARGV), "S"), False),  # not a bare PID
        (QemuProcess(b'{"pid": 4242}', cmdline(REAL_ARGV), "S"), False),
        (QemuProcess(b"4242", cmdline(["/usr/bin/python3", "-pidfile", PIDFILE]), "S"), False),
        (
            QemuProcess(b"4242", cmdline(["/usr/bin/kvm", "-pidfile", "/var/run/qemu-server/101.pid"]), "S"),
            False,
        ),
        (QemuProcess(b"4242", cmdline(["/usr/bin/kvm", "-pidfile"]), "S"), False),  # no value
        (
            QemuProcess(b"4242", cmdline(["/usr/bin/kvm", "-x\n-pidfile", PIDFILE]), "S"),
            False,
        ),  # read as a line
    ],
)
def test_qemu_running_as_instance_running_locally(process: QemuProcess, running: bool) -> None:
    assert qemu_running(process, 100) is running


def test_status_answer_from_the_config_and_the_process() -> None:
    config = b"name: llm\nmemory: 65536\n"
    running = QemuProcess(b"4242", cmdline(REAL_ARGV), "S")
    assert qemu_status_answer(config, running, 100) == {"vmid": 100, "status": "running", "name": "llm"}
    stopped = QemuProcess(None, None, None)
    assert qemu_status_answer(b"memory: 512\n", stopped, 100) == {
        "vmid": 100,
        "status": "stopped",
        "name": "VM 100",
    }
    assert qemu_status_answer(b"memory: 512\n[PENDING]\nmemory: 1024\n", stopped, 100) is None  # not modelled


@contextlib.contextmanager
def kvm_process(argv: list[str]) -> Iterator[int]:
    """A process whose /proc/<pid>/cmdline is `argv` (python3 under argv[0]), ended afterwards."""
    child = subprocess.Popen(
        [argv[0], "-c", "import time; time.sleep(60)", *argv[1:]], executable=sys.executable
    )
    try:
        yield child.pid
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait()


def test_node_read_brings_what_check_running_reads(tmp_path: Path) -> None:
    """The `qemu` part's shell on this machine: a VM with a live process, one with a stale pidfile, one
    without."""
    with kvm_process(REAL_ARGV) as pid:
        (tmp_path / "100.pid").write_text(f"{pid}\n")
        (tmp_path / "101.pid").write_text("999999999\n")
        command = qemu_processes_command([100, 101, 102], run_dir=str(tmp_path))
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        processes = parse_qemu_processes(done.stdout.splitlines())
        own = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert done.stderr == ""
    state = processes[100].state
    assert state in ("R", "S")  # running or sleeping: its stat's third field
    assert processes == {
        100: QemuProcess(str(pid).encode(), own, state),
        101: QemuProcess(b"999999999", None, None),
        102: QemuProcess(None, None, None),
    }
    assert own.startswith(b"/usr/bin/kvm\0-c\0")
    assert [qemu_running(processes[vmid], vmid) for vmid in (100, 101, 102)] == [True, False, False]
    assert done.stdout.splitlines()[1:] == [
        "101\t" + base64.b64encode(b"999999999").decode() + "\t-\t-",
        "102\t-\t-\t-",
    ]


@pytest.mark.parametrize("line", ["100\t-\t-", "x\t-\t-\t-", "\u00b2\t-\t-\t-", "100\t!!\t-\t-"])
def test_error_qemu_part_line(line: str) -> None:
    with pytest.raises(FactParseError) as raised:
        parse_qemu_processes([line])
    assert str(raised.value) == f"node state qemu: unexpected line {line!r}"


def test_status_seeded_while_the_node_read_holds() -> None:
    """The seeded status answers every read while `fresh()` and no write came; then Proxmox is asked."""
    sent: list[str] = []

    def transport(method: Method, path: str, params: Params) -> object:
        sent.append(f"{method} {path} {params}")
        return None if method != "GET" else {"vmid": 100, "status": "stopped"}

    api = shared_reads(PveClient(transport))
    holds = [True]
    answer = {"vmid": 100, "status": "running", "name": "llm"}
    assert seed_status(api, lambda api: api.vm_status("pve1", 100), answer, lambda: holds[0]) is True
    assert seed_status(api, lambda api: api.vm_status("pve1", 100), answer, lambda: True) is False  # kept
    assert [api.vm_status("pve1", 100).status for _ in range(2)] == ["running", "running"]
    assert sent == []
    holds[0] = False  # a command ran on the node since its read
    assert api.vm_status("pve1", 100).status == "stopped"
    assert seed_status(api, lambda api: api.vm_status("pve1", 100), answer, lambda: True) is True
    api.call("POST", "/nodes/pve1/qemu/100/status/stop", {})
    assert api.vm_status("pve1", 100).status == "stopped"  # a write drops it
    assert sent == [
        "GET /nodes/pve1/qemu/100/status/current {}",
        "POST /nodes/pve1/qemu/100/status/stop {}",
        "GET /nodes/pve1/qemu/100/status/current {}",
    ]


# --- the stand-in's running VM ------------------------------------------------------------------------


def pid_of(pve: Pve) -> int:
    text = (pve.root / PIDFILE.lstrip("/")).read_text()
    assert text.endswith("\n"), text
    assert text[:-1].isdigit(), text
    return int(text)


def test_stand_in_vm_is_a_process_naming_its_pidfile(pve: Pve) -> None:
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0)
    assert pve("create", "/nodes/pve1/qemu/100/status/start").rc == 0
    pid = pid_of(pve)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    status = pve.json("get", "/nodes/pve1/qemu/100/status/current")
    assert (argv[:2], argv[3:]) == (
        [b"/usr/bin/kvm", b"-c"],
        [b"-id", b"100", b"-name", b"gpuvm", b"-pidfile", PIDFILE.encode(), b"-daemonize", b""],
    )
    assert (status["status"], status["pid"]) == ("running", pid)
    assert qemu_running_pid(pvesh_settings(pve), "100") == pid

    assert pve("create", "/nodes/pve1/qemu/100/status/stop").rc == 0
    assert not (pve.root / PIDFILE.lstrip("/")).exists()
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "stopped"
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1]
    )


def test_stand_in_vm_whose_process_is_gone_is_stopped(pve: Pve) -> None:
    """A pidfile left by a killed QEMU does not make the VM running (as on Proxmox)."""
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0)
    assert pve("create", "/nodes/pve1/qemu/100/status/start").rc == 0
    pid = pid_of(pve)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while qemu_running_pid(pvesh_settings(pve), "100") is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "stopped"


def test_stand_in_runs_the_pre_start_hook_under_the_vms_config_lock(pve: Pve) -> None:
    lock = pve.root / "var/lock/qemu-server/lock-100.conf"
    hook(pve, f"#!/bin/sh\nflock -n {lock} true && echo free || echo held\n")
    pve("set", "/nodes/pve1/qemu/100/config", "--hookscript", HOOK)
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0)
    started = pve("create", "/nodes/pve1/qemu/100/status/start")
    assert task_log(pve, started).splitlines()[0] == "held"
    assert pve("create", "/nodes/pve1/qemu/100/status/stop").rc == 0
    assert subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode == 0  # released


def pvesh_settings(pve: Pve) -> Settings:
    config = json.loads((pve.base / "pve.json").read_text())
    return Settings(config["node"], Path(config["sysfs_root"]), Path(config["root"]), None, 1.0, "", "")


# --- one map line's paths are one alternative -------------------------------------------------------------


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[tuple[Pve, Hypervisor]]:
    """A stand-in whose lab hypervisor records each start's request (the devices qemu-server would pass)."""
    hv = Hypervisor(tmp_path / "hv", lambda _request: {"ok": True, "pid": os.getpid(), "guest": None})
    hv.folder.mkdir()
    installed = Pve(tmp_path)
    fakesys.write_tree(installed.sysfs, "reference")
    settings: dict[str, object] = {
        "node": NODE,
        "sysfs_root": str(installed.sysfs),
        "root": str(installed.root),
    }
    settings |= {"hypervisor_dir": str(hv.folder), "hypervisor_timeout_s": 20}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    thread = threading.Thread(target=hv.serve, daemon=True)
    thread.start()
    yield installed, hv
    installed("create", "/nodes/pve1/qemu/100/status/stop")
    hv.stop.set()
    thread.join()


def functions_of(slot: str) -> list[str]:
    return sorted(f for f in REFERENCE["devices"] if f.startswith(slot + "."))


def start_with(pve: Pve, *hostpci: str) -> Result:
    keys = [arg for index, value in enumerate(hostpci) for arg in (f"--hostpci{index}", value)]
    assert pve("create", "/nodes/pve1/qemu", *VM_ARGS, *keys).rc == 0
    return pve("create", "/nodes/pve1/qemu/100/status/start")


def test_a_map_lines_paths_are_passed_together(recorded: tuple[Pve, Hypervisor]) -> None:
    pve, hv = recorded
    slot0, slot1 = REFERENCE["gpus"][0]["address"], REFERENCE["gpus"][1]["address"]
    both = GPU0.replace(f"path={slot0}", f"path={slot0};{slot1}")
    assert pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", both).rc == 0
    assert start_with(pve, "mapping=gpu0,pcie=1").rc == 0
    [device] = hv.requests[0]["devices"]
    assert (device["hostpci"], device["functions"]) == (0, functions_of(slot0) + functions_of(slot1))


def test_a_nodes_map_lines_are_the_alternatives(recorded: tuple[Pve, Hypervisor]) -> None:
    pve, hv = recorded
    slot0, slot1 = REFERENCE["gpus"][0]["address"], REFERENCE["gpus"][1]["address"]
    assert pve("create", "/cluster/mapping/pci", "--id", "gpu", "--map", GPU0, "--map", GPU1).rc == 0
    assert start_with(pve, "mapping=gpu,pcie=1", "mapping=gpu,pcie=1").rc == 0
    assert [d["functions"] for d in hv.requests[0]["devices"]] == [functions_of(slot0), functions_of(slot1)]


def test_error_one_alternative_twice(recorded: tuple[Pve, Hypervisor]) -> None:
    pve, hv = recorded
    slot1 = REFERENCE["gpus"][1]["address"]
    assert pve("create", "/cluster/mapping/pci", "--id", "gpu1", "--map", GPU1).rc == 0
    started = start_with(pve, "mapping=gpu1,pcie=1", "mapping=gpu1,pcie=1")
    assert started.err == f"device '{slot1}.0' assigned more than once\n"  # the start task's error
    assert hv.requests == []
