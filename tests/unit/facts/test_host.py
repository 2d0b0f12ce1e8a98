"""Host-role facts: CPU vendor, kernel release, pvegpu's boot files.

Evidence: each command also runs on this machine through pyinfra (real /proc/cpuinfo, `uname -r`, /etc),
compared with what Python reads directly. The literal lines are the kernel's formats (synthesized, labelled).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.facts import get_fact

from pvegpu.facts.cpu import (
    VENDORS,
    CpuAndKernel,
    parse_cpu_kernel,
    parse_cpu_vendor,
    parse_kernel_release,
)
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.pvegpu_boot import BootFiles, EspEntries, PvegpuBootFiles, parse_boot_files
from pvegpu.models.boot import CpuKernel
from tests.unit.pyinfra_local import local_state


@pytest.mark.parametrize(
    ("lines", "vendor"),
    [
        (["vendor_id\t: AuthenticAMD"], "amd"),  # synthesized: /proc/cpuinfo's x86 line format
        (["vendor_id\t: GenuineIntel"], "intel"),
        ([], None),  # no vendor_id line: not x86
    ],
)
def test_cpu_vendor(lines: list[str], vendor: str | None) -> None:
    assert parse_cpu_vendor(lines) == vendor


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ["vendor_id\t: HygonGenuine"],
            "/proc/cpuinfo: CPU vendor 'HygonGenuine' is neither AuthenticAMD nor GenuineIntel",
        ),
        (
            ["model name : x"],
            "/proc/cpuinfo: expected one 'vendor_id : <vendor>' line, got ['model name : x']",
        ),
    ],
)
def test_cpu_vendor_refused(lines: list[str], message: str) -> None:
    with pytest.raises(FactParseError) as raised:
        parse_cpu_vendor(lines)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("release", "parsed"),
    [("6.8.12-4-pve", (6, 8)), ("6.1.0-27-amd64", (6, 1)), ("5.15.143-1-pve", (5, 15))],
)
def test_kernel_release(release: str, parsed: tuple[int, int]) -> None:
    assert parse_kernel_release([release]) == parsed


def test_kernel_release_garbled() -> None:
    with pytest.raises(FactParseError) as raised:
        parse_kernel_release([])
    assert str(raised.value) == "uname -r: expected a release like 6.8.12-4-pve, got []"


def test_cpu_and_kernel_of_this_machine_through_pyinfra() -> None:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    found = re.search(r"^vendor_id\s*:\s*(\S+)", cpuinfo, re.MULTILINE)
    bits = re.search(r"^address sizes\s*:\s*(\d+) bits physical", cpuinfo, re.MULTILINE)
    assert found is not None, "this test needs an x86 machine"
    assert bits is not None, "this test needs an x86 machine"
    major, minor = os.uname().release.split(".")[:2]
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev}${Version}", "qemu-server"],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = re.match(r"ii ?(\d+)\.(\d+)\.(\d+)", done.stdout)
    qemu_server = None if installed is None else (int(installed[1]), int(installed[2]), int(installed[3]))
    state, local = local_state()
    assert get_fact(state, local, CpuAndKernel) == CpuKernel(
        VENDORS[found[1]], (int(major), int(minor)), int(bits[1]), qemu_server
    )


@pytest.mark.parametrize(
    ("lines", "parsed"),
    [
        (["6.8.12-4-pve", "vendor_id\t: AuthenticAMD"], CpuKernel("amd", (6, 8))),
        (["6.1.0-27-arm64"], CpuKernel(None, (6, 1))),
        (
            [  # synthesized: a Proxmox VE 9 node on EPYC 9004 (/proc/cpuinfo's lines, dpkg-query's format)
                "6.14.8-2-pve",
                "vendor_id\t: AuthenticAMD",
                "address sizes\t: 52 bits physical, 57 bits virtual",
                "qemu-server ii 9.2.6",
            ],
            CpuKernel("amd", (6, 14), 52, (9, 2, 6)),
        ),
        (["6.8.12-4-pve", "qemu-server rc 8.3.8"], CpuKernel(None, (6, 8))),  # removed, config files left
        (["6.8.12-4-pve", "qemu-server ii 8.4.10~bpo1"], CpuKernel(None, (6, 8), None, (8, 4, 10))),
    ],
)
def test_cpu_and_kernel(lines: list[str], parsed: CpuKernel) -> None:
    assert parse_cpu_kernel(lines) == parsed


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ["6.8.12-4-pve", "address sizes\t: 52 bits"],
            "/proc/cpuinfo: expected one 'address sizes : <N> bits physical, <M> bits virtual' line, got "
            "['address sizes\\t: 52 bits']",
        ),
        (
            ["6.8.12-4-pve", "qemu-server ii nine"],
            "dpkg-query: qemu-server version 'nine' is not <major>.<minor>.<patch>",
        ),
    ],
)
def test_cpu_and_kernel_refused(lines: list[str], message: str) -> None:
    with pytest.raises(FactParseError) as raised:
        parse_cpu_kernel(lines)
    assert str(raised.value) == message


def test_cpu_and_kernel_without_output() -> None:
    with pytest.raises(FactParseError) as raised:
        parse_cpu_kernel([])
    assert str(raised.value) == "uname -r: no output"


def test_boot_files_sections() -> None:
    lines = [
        "#pvegpu:kernel_cmdline",
        "present",
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet",
        "#pvegpu:backup",
        "present",
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet",
        "#pvegpu:grub_dropin",
        "#pvegpu:owned",
        "present",
        "amd_iommu=on",
        "iommu=pt",
        "#pvegpu:modules_load",
        "present",
        "",
        "#pvegpu:modprobe",
        "#pvegpu:grub_cfg",
        "present",
        "newer-than-dropin",
        "\tlinux\t/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet amd_iommu=on iommu=pt",
        "\tlinux\t/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro single amd_iommu=on",
        "#pvegpu:esps",
        "esp 5A1B-2C3D",
        "options  root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet",
        "options  root=ZFS=rpool/ROOT/pve-1 boot=zfs",
        "esp 5A1B-9999",
        "unreadable",
        "#pvegpu:initramfs",
        "initrd.img-6.8.12-4-pve",
        "#pvegpu:end",
    ]
    assert parse_boot_files(lines) == BootFiles(
        kernel_cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n",
        backup="root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n",
        grub_dropin=None,
        owned_tokens=("amd_iommu=on", "iommu=pt"),
        modules_load="\n",
        modprobe=None,
        grub_cfg_lines=(
            (
                "/boot/vmlinuz-6.8.12-4-pve",
                "root=/dev/mapper/pve-root",
                "ro",
                "quiet",
                "amd_iommu=on",
                "iommu=pt",
            ),
            ("/boot/vmlinuz-6.8.12-4-pve", "root=/dev/mapper/pve-root", "ro", "single", "amd_iommu=on"),
        ),
        grub_cfg_current=True,
        esps=(
            EspEntries(
                "5A1B-2C3D",
                (
                    ("root=ZFS=rpool/ROOT/pve-1", "boot=zfs", "quiet"),
                    ("root=ZFS=rpool/ROOT/pve-1", "boot=zfs"),
                ),
            ),
            EspEntries("5A1B-9999", (), readable=False),
        ),
        stale_initramfs=("initrd.img-6.8.12-4-pve",),
    )


def test_boot_files_without_generated_state() -> None:
    lines = [f"#pvegpu:{name}" for name in ("kernel_cmdline", "backup", "grub_dropin", "owned")]
    lines += [
        f"#pvegpu:{name}" for name in ("modules_load", "modprobe", "grub_cfg", "esps", "initramfs", "end")
    ]
    files = parse_boot_files(lines)
    assert (files.grub_cfg_lines, files.grub_cfg_current, files.esps, files.stale_initramfs) == (
        None,
        False,
        (),
        (),
    )


def test_boot_files_esp_output_before_an_esp_line() -> None:
    lines = [f"#pvegpu:{name}" for name in ("kernel_cmdline", "backup", "grub_dropin", "owned")]
    lines += ["#pvegpu:modules_load", "#pvegpu:modprobe", "#pvegpu:grub_cfg", "#pvegpu:esps", "options x"]
    lines += ["#pvegpu:initramfs", "#pvegpu:end"]
    with pytest.raises(FactParseError) as raised:
        parse_boot_files(lines)
    assert str(raised.value) == "ESP line 1: 'options x' before any `esp UUID` line"


def test_boot_files_truncated() -> None:
    with pytest.raises(FactParseError) as raised:
        parse_boot_files(["#pvegpu:kernel_cmdline"])
    assert str(raised.value) == "truncated output: the #pvegpu:backup marker is missing"


def test_boot_files_of_this_machine_through_pyinfra() -> None:
    def read(path: str) -> str | None:
        file = Path(path)
        return file.read_text() if file.is_file() else None

    state, local = local_state()
    owned = read("/etc/pvegpu/cmdline-tokens") or ""
    assert get_fact(state, local, PvegpuBootFiles) == BootFiles(
        kernel_cmdline=read("/etc/kernel/cmdline"),
        backup=read("/etc/kernel/cmdline.pvegpu-orig"),
        grub_dropin=read("/etc/default/grub.d/pvegpu.cfg"),
        owned_tokens=tuple(owned.split()),
        modules_load=read("/etc/modules-load.d/pvegpu-vfio.conf"),
        modprobe=read("/etc/modprobe.d/pvegpu-vfio.conf"),
    )
