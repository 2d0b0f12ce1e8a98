"""`lxc_raw_lines`' edit of a container's config, run for real (sh, awk, flock) on files shaped as
pve-container's write_pct_config writes them (synthesized: main section, `[pve:pending]`, snapshots in name
order, one blank line before each section header): exact file content after the edit, the lock it takes,
and the refusals of values that would not read back."""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.operations.lxc import LXC_LOCK_DIR, lxc_raw_lines, raw_lines_command
from pvegpu.operations.pve_guest import CT, Guest
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import plan_lxc_devices, raw_line_problem
from tests.unit.fake_pve import FakeApi
from tests.unit.op_harness import run_op

SHM = "lxc.mount.entry: tmpfs dev/shm tmpfs "
SHM_16 = f"{SHM}size=16G,nosuid,nodev,create=dir 0 0"
SHM_8 = f"{SHM}size=8G,nosuid,nodev,create=dir 0 0"
ALLOW = "lxc.cgroup2.devices.allow: c 195:* rwm"

SNAPSHOTTED = f"""#GPU container
arch: amd64
hostname: gpu-ct
{SHM_8}
parent: before-upgrade

[pve:pending]
cores: 16
{SHM_8}

[before-upgrade]
arch: amd64
hostname: gpu-ct
{SHM_8}
snaptime: 1733130000
"""


def edit(tmp_path: Path, text: str, wanted: list[str], vmid: int = 200) -> subprocess.CompletedProcess[str]:
    """Run the command with /etc/pve/lxc and /run/lock/lxc moved under `tmp_path`."""
    conf = tmp_path / "lxc" / f"{vmid}.conf"
    conf.parent.mkdir(exist_ok=True)
    if not conf.exists() or conf.read_text() != text:
        conf.write_text(text)
    command = raw_lines_command(vmid, wanted, SHM)
    command = command.replace("/etc/pve/lxc", str(conf.parent)).replace(LXC_LOCK_DIR, str(tmp_path / "lock"))
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=False)


def test_update_lines_go_to_the_main_section_pending_and_snapshot_kept(tmp_path: Path) -> None:
    run = edit(tmp_path, SNAPSHOTTED, [ALLOW, SHM_16])

    assert (run.returncode, run.stderr) == (0, "")
    assert (
        (tmp_path / "lxc/200.conf").read_text()
        == f"""#GPU container
arch: amd64
hostname: gpu-ct
parent: before-upgrade
{ALLOW}
{SHM_16}

[pve:pending]
cores: 16
{SHM_8}

[before-upgrade]
arch: amd64
hostname: gpu-ct
{SHM_8}
snaptime: 1733130000
"""
    )
    assert sorted(p.name for p in (tmp_path / "lxc").iterdir()) == ["200.conf"]  # no temporary file left


def test_create_lines_appended_to_a_config_without_sections(tmp_path: Path) -> None:
    run = edit(tmp_path, "arch: amd64\nhostname: gpu-ct\n", [SHM_16])

    assert run.returncode == 0
    assert (tmp_path / "lxc/200.conf").read_text() == f"arch: amd64\nhostname: gpu-ct\n{SHM_16}\n"


def test_noop_line_written_as_key_equals_value_counts_and_file_untouched(tmp_path: Path) -> None:
    text = f"arch: amd64\nlxc.cgroup2.devices.allow = c 195:* rwm\n{SHM_16}\n\n[snap]\narch: amd64\n"
    conf = tmp_path / "lxc/200.conf"

    conf.parent.mkdir()
    conf.write_text(text)
    before = conf.stat()

    run = edit(tmp_path, text, [ALLOW, SHM_16])

    assert (run.returncode, run.stderr) == (0, "")
    assert conf.read_text() == text
    assert (conf.stat().st_ino, conf.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_error_locked_container_left_as_it_was(tmp_path: Path) -> None:
    text = f"arch: amd64\nlock: snapshot\n{SHM_8}\n"

    run = edit(tmp_path, text, [SHM_16])

    assert (run.returncode, run.stderr) == (1, "CT 200 is locked (snapshot): raw lxc lines not written\n")
    assert (tmp_path / "lxc/200.conf").read_text() == text
    assert sorted(p.name for p in (tmp_path / "lxc").iterdir()) == ["200.conf"]


def test_error_missing_config(tmp_path: Path) -> None:
    command = raw_lines_command(201, [SHM_16], SHM).replace("/etc/pve/lxc", str(tmp_path))
    command = command.replace(LXC_LOCK_DIR, str(tmp_path / "lock"))

    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=False)

    assert (run.returncode, run.stderr) == (
        1,
        f"CT 201: {tmp_path}/201.conf does not exist: raw lxc lines not written\n",
    )


def test_edit_waits_for_pve_containers_lock(tmp_path: Path) -> None:
    """The same flock pve-container's lock_config takes: held by another, the edit fails after 10 s
    without writing (shortened here to the lock's refusal: LOCK_NB shows the lock is the same file)."""
    command = raw_lines_command(200, [SHM_16], SHM)
    assert command.splitlines()[:2] == [
        "mkdir -p /run/lock/lxc && (",
        "flock -w 10 9 || { echo \"can't lock file '/run/lock/lxc/pve-config-200.lock' - got timeout\" >&2; "
        "exit 1; }",
    ]
    assert command.splitlines()[-1] == ") 9>>/run/lock/lxc/pve-config-200.lock"
    lock = tmp_path / "lock/pve-config-200.lock"
    lock.parent.mkdir()
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        quick = command.replace("flock -w 10", "flock -w 0")
        quick = quick.replace("/etc/pve/lxc", str(tmp_path)).replace(LXC_LOCK_DIR, str(lock.parent))
        (tmp_path / "200.conf").write_text("arch: amd64\n")
        run = subprocess.run(["sh", "-c", quick], capture_output=True, text=True, timeout=30, check=False)
    assert (run.returncode, run.stderr) == (
        1,
        f"can't lock file '{lock.parent}/pve-config-200.lock' - got timeout\n",
    )
    assert (tmp_path / "200.conf").read_text() == "arch: amd64\n"


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        (
            "lxc.mount.entry",
            "/dev/nvidia0 dev/nvidia0 none bind\nlxc.hook.pre-start: /x",
            "raw lxc line lxc.mount.entry: value "
            "'/dev/nvidia0 dev/nvidia0 none bind\\nlxc.hook.pre-start: /x' "
            "is empty or has a control character",
        ),
        ("lxc.mount.entry", "", "raw lxc line lxc.mount.entry: value '' is empty or has a control character"),
        (
            "lxc.mount.entry",
            "a\tb",
            "raw lxc line lxc.mount.entry: value 'a\\tb' is empty or has a control character",
        ),
        ("lxc.mount.entry", "a ", "raw lxc line lxc.mount.entry: value 'a ' starts or ends with a blank"),
        ("lxc.Mount", "a", "raw lxc line: key 'lxc.Mount' is not like lxc.<name> (a-z, 0-9, _ . -)"),
        ("cores", "4", "raw lxc line: key 'cores' is not like lxc.<name> (a-z, 0-9, _ . -)"),
    ],
)
def test_error_raw_line_refused_before_anything_is_read(key: str, value: str, problem: str) -> None:
    assert raw_line_problem(key, value) == problem
    with pytest.raises(OperationError) as raised:
        run_op(
            lxc_raw_lines,
            {},
            guest=Guest(CT, FakeApi({}).client, "pve1", 200),
            wanted=[(key, value)],
            replace=SHM,
        )
    assert str(raised.value) == f"CT 200: {problem}"


def test_error_caps_node_with_a_space_refused_by_the_plan() -> None:
    with pytest.raises(PlanError) as raised:
        plan_lxc_devices(
            1, (8, 0), ("/dev/nvidia-caps/nvidia-cap1 x",), {"nvidia-uvm": 510, "nvidia-caps": 235}
        )
    assert str(raised.value) == (
        "host: '/dev/nvidia-caps/nvidia-cap1 x' is not a device node like /dev/nvidia-caps/nvidia-capN: "
        "not writing it into the container's config"
    )
