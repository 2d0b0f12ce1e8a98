"""The lab's nvidia-modprobe stand-in (lab/standins/nvidia_modprobe.py) against temporary /dev and settings.

Expected behaviour and texts are NVIDIA's (github.com/NVIDIA/nvidia-modprobe: nvidia-modprobe.c,
option-table.h, modprobe-utils/nvidia-modprobe-utils.c; common-utils/nvgetopt.c and msg.c for the command
line errors and the `ERROR:` block a non-terminal stderr gets). Creating device nodes needs root, as the
real tool does.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.standins import nvidia_modprobe

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root (the real tool is setuid root)")

PROG = "/usr/bin/nvidia-modprobe"
INVALID = f"\nERROR: Invalid commandline, please run `{PROG} --help` for usage information.\n\n\n"
# A real /proc/devices layout (character devices, a blank line, block devices) with NVIDIA's dynamic majors.
PROC_DEVICES = (
    "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n"
)


@dataclass
class Tool:
    base: Path

    @property
    def dev(self) -> Path:
        return self.base / "dev"

    @property
    def version(self) -> Path:
        return self.base / "proc/driver/nvidia/version"

    def __call__(self, *argv: str, proc_devices: str | None = None) -> int:
        devices = self.base / "devices"
        if proc_devices is not None:
            devices.write_text(proc_devices)
        return nvidia_modprobe.main(
            list(argv), PROG, config=self.base / "nvidia.env", dev=self.dev, proc_devices=devices
        )

    def nodes(self) -> list[tuple[str, int, int, str, int]]:
        """(path under dev, major, minor, mode, gid) of every char device under dev, sorted."""
        found = []
        for path in sorted(self.dev.rglob("*")):
            info = path.lstat()
            if stat.S_ISCHR(info.st_mode):
                rel = str(path.relative_to(self.dev))
                mode = oct(stat.S_IMODE(info.st_mode))
                found.append((rel, os.major(info.st_rdev), os.minor(info.st_rdev), mode, info.st_gid))
        return found


@pytest.fixture
def tool(tmp_path: Path) -> Tool:
    made = Tool(tmp_path)
    made.dev.mkdir()
    made.version.parent.mkdir(parents=True)
    made.version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  ...\n")
    (tmp_path / "nvidia.env").write_text(f"SYSFS_ROOT=/sys\nVERSION_FILE={made.version}\n")
    return made


def test_create_gpu_ctl_modeset_then_uvm_nodes(tool: Tool) -> None:
    assert tool("-c", "0", "-c1", "--create-nvidia-device-file=255", "-m") == 0
    assert tool("-u", "-c", "0") == 0  # no nvidia-uvm in /proc/devices: the lab's major

    assert tool.nodes() == [
        ("nvidia-modeset", 195, 254, "0o666", 0),
        ("nvidia-uvm", 508, 0, "0o666", 0),
        ("nvidia-uvm-tools", 508, 1, "0o666", 0),
        ("nvidia0", 195, 0, "0o666", 0),
        ("nvidia1", 195, 1, "0o666", 0),
        ("nvidiactl", 195, 255, "0o666", 0),
    ]


def test_uvm_major_from_proc_devices_and_integers_as_strtol_reads_them(tool: Tool) -> None:
    assert tool("-uc", "0x10", proc_devices=PROC_DEVICES) == 0  # bundled: -u, then -c with the next word
    hex_minors = tool.nodes()
    assert tool("-mu", "--create-nvidia-device-file", "010", proc_devices=PROC_DEVICES) == 0  # octal 8

    assert hex_minors == [("nvidia-uvm", 510, 16, "0o666", 0), ("nvidia-uvm-tools", 510, 17, "0o666", 0)]
    assert tool.nodes() == [
        ("nvidia-modeset", 195, 254, "0o666", 0),
        ("nvidia-uvm", 510, 8, "0o666", 0),
        ("nvidia-uvm-tools", 510, 9, "0o666", 0),
    ]


def test_existing_nodes_are_fixed_in_place_or_replaced(tool: Tool) -> None:
    os.mknod(tool.dev / "nvidia0", stat.S_IFCHR | 0o600, os.makedev(195, 0))
    (tool.dev / "nvidia1").write_text("not a device")
    os.mknod(tool.dev / "nvidia2", stat.S_IFCHR | 0o666, os.makedev(195, 9))
    kept = (tool.dev / "nvidia0").stat().st_ino

    assert tool("-c", "0", "-c", "1", "-c", "2") == 0

    assert tool.nodes() == [(f"nvidia{n}", 195, n, "0o666", 0) for n in range(3)]
    assert (tool.dev / "nvidia0").stat().st_ino == kept


def test_parameters_file_mode_and_group_and_capability_files(tool: Tool) -> None:
    (tool.version.with_name("params")).write_text(
        "ResmanDebugLevel: 4294967295\nDeviceFileUID: 0\nDeviceFileGID: 44\nDeviceFileMode: 432\n"
    )
    cap = tool.base / "mig-config"
    cap.write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")

    assert tool("-c", "3", "-f", str(cap), proc_devices=PROC_DEVICES) == 0

    assert tool.nodes() == [("nvidia-caps/nvidia-cap1", 234, 1, "0o400", 0), ("nvidia3", 195, 3, "0o660", 44)]


def test_error_no_module_loaded_creates_nothing(tool: Tool, capsys: pytest.CaptureFixture[str]) -> None:
    tool.version.unlink()

    assert tool("-c", "0") == 1

    assert capsys.readouterr().err == (
        f"{PROG}: pvegpu lab STAND-IN: the NVIDIA kernel module is not loaded ({tool.version} is absent)\n"
    )
    assert tool.nodes() == []


def test_error_stops_at_the_first_bad_minor_after_the_good_ones(
    tool: Tool, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tool("-c", "0", "-c", "256", "-c", "1") == 1

    assert capsys.readouterr().err == f"{PROG}: pvegpu lab STAND-IN: no NVIDIA device file for minor 256\n"
    assert tool.nodes() == [("nvidia0", 195, 0, "0o666", 0)]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--foo"], f'{PROG}: unrecognized option: "--foo"'),
        (["-cm"], f'{PROG}: unrecognized option: "-cm"'),
        (["--no-modeset"], f'{PROG}: unrecognized option: "--no-modeset"'),
        (["0"], f'{PROG}: invalid option: "0"'),
        (["-c"], f'{PROG}: option "-c" requires an argument.'),
        (
            ["--create-nvidia-device-file="],
            f'{PROG}: option "--create-nvidia-device-file" requires an argument.',
        ),
        (["-c", "one"], f'{PROG}: "one" is not a valid argument for option "-c".'),
        (["-c", "08"], f'{PROG}: "08" is not a valid argument for option "-c".'),
        (
            ["--modeset=1"],
            f'{PROG}: option "--modeset" does not take an argument, but was given an argument of "1".',
        ),
    ],
    ids=[
        "unknown",
        "bundled-argument",
        "negated",
        "word",
        "missing",
        "empty",
        "not-int",
        "bad-octal",
        "flag-value",
    ],
)
def test_error_command_line_as_nvgetopt(
    tool: Tool, capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert tool(*argv) == 1
    assert capsys.readouterr().err == f"{line}\n{INVALID}"
    assert tool.nodes() == []


def test_double_dash_ends_the_options_and_version_exits_first(
    tool: Tool, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tool("-c", "4", "--", "--foo") == 0
    assert tool("-v", "--foo") == 0

    assert capsys.readouterr() == (
        f"{PROG}: pvegpu lab STAND-IN for NVIDIA's nvidia-modprobe (device files only)\n",
        "",
    )
    assert tool.nodes() == [("nvidia4", 195, 4, "0o666", 0)]


def test_error_too_many_minors_and_unmodelled_options(tool: Tool, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(*[arg for n in range(65) for arg in ("-c", str(n))]) == 1
    assert capsys.readouterr().err == "\nERROR: Too many NVIDIA character device files requested.\n\n"
    assert tool("-s", "-c", "0") == 1
    assert capsys.readouterr().err == f"{PROG}: pvegpu lab STAND-IN: --nvswitch is not modelled\n"
    assert tool.nodes() == []
