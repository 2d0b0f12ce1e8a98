"""The next boot's kernel and its NVIDIA module: the pins proxmox-boot-tool writes, the newest image
otherwise, DKMS's build tree, the driver floor of the kernel series; the fact's command run on real files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.next_boot import NextBoot, parse_next_boot
from pvegpu.models.boot import KernelBoot
from pvegpu.operations.reboot import refuse_kernel_without_module
from pvegpu.plan.kernel_guard import (
    kernel_problems,
    module_built_anywhere,
    next_boot_kernel,
    next_boot_report,
    release_key,
)

RUNNING = "6.8.12-9-pve"


def boot(*installed: str, built: dict[str, tuple[str, ...]] | None = None, pin: str | None = None,
         next_pin: str | None = None) -> KernelBoot:  # fmt: skip
    return KernelBoot(RUNNING, installed, pin, next_pin, built or {})


def test_release_order_is_sort_v() -> None:
    releases = ["6.8.12-10-pve", "6.8.12-9-pve", "7.0.2-1-pve", "6.14.8-2-pve", "6.8.4-2-pve"]
    assert sorted(releases, key=release_key) == [
        "6.8.4-2-pve", "6.8.12-9-pve", "6.8.12-10-pve", "6.14.8-2-pve", "7.0.2-1-pve",
    ]  # fmt: skip


def test_next_boot_pins_first_then_the_newest_image() -> None:
    installed = ("6.8.12-9-pve", "7.0.2-1-pve", "6.14.8-2-pve")
    assert next_boot_kernel(boot(*installed)) == "7.0.2-1-pve"
    assert next_boot_kernel(boot(*installed, pin="6.8.12-9-pve")) == "6.8.12-9-pve"
    assert next_boot_kernel(boot(*installed, pin="6.8.12-9-pve", next_pin="6.14.8-2-pve")) == "6.14.8-2-pve"
    assert next_boot_kernel(boot()) is None


def test_a_new_kernel_without_the_module_is_named_with_the_fix() -> None:
    state = boot("6.8.12-9-pve", "6.14.8-2-pve", built={"6.8.12-9-pve": ("590.48.01",)})
    assert module_built_anywhere(state, "590.48.01")
    assert kernel_problems(state, "590.48.01", proxmox=True) == (
        "kernel 6.14.8-2-pve (next boot) has no NVIDIA module 590.48.01 built by DKMS (built: none): apt "
        "install proxmox-headers-6.14.8-2-pve, then dkms autoinstall -k 6.14.8-2-pve; or pin the running "
        "kernel: proxmox-boot-tool kernel pin 6.8.12-9-pve",
    )
    built = {**state.built, "6.14.8-2-pve": ("590.48.01",)}
    assert kernel_problems(boot(*state.installed, built=built), "590.48.01", proxmox=True) == ()


def test_kernel_7_needs_driver_595() -> None:
    state = boot("6.8.12-9-pve", "7.0.2-1-pve", built={"6.8.12-9-pve": ("590.48.01",), "7.0.2-1-pve": ()})
    assert kernel_problems(state, "590.48.01", proxmox=False) == (
        "kernel 7.0.2-1-pve (next boot) needs NVIDIA driver 595 or newer, driver.version is 590.48.01 "
        "(NVIDIA 590's DKMS module fails to build on Linux 7.0 (Proxmox VE 9.2's kernel), 595 builds): raise "
        "driver.version, or keep booting 6.8.12-9-pve (GRUB_DEFAULT)",
        "kernel 7.0.2-1-pve (next boot) has no NVIDIA module 590.48.01 built by DKMS (built: none): apt "
        "install linux-headers-7.0.2-1-pve, then dkms autoinstall -k 7.0.2-1-pve; or keep booting "
        "6.8.12-9-pve (GRUB_DEFAULT)",
    )
    ok = boot("7.0.2-1-pve", built={"7.0.2-1-pve": ("595.58.03",)})
    assert kernel_problems(ok, "595.58.03", proxmox=True) == ()
    assert not module_built_anywhere(boot("6.8.12-9-pve"), "590.48.01")  # not installed yet: no guard


def test_no_image_says_so() -> None:
    assert kernel_problems(boot(), "590.48.01", proxmox=True) == (
        "no kernel image in /boot (vmlinuz-*): cannot tell which kernel boots next",
    )


def test_fact_command_reads_pins_images_and_the_dkms_tree(tmp_path: Path) -> None:
    """The one command on a real tree: pin files' first lines, the images, DKMS's module directories."""
    for image in ("6.8.12-9-pve", "6.14.8-2-pve"):
        (tmp_path / "boot").mkdir(exist_ok=True)
        (tmp_path / f"boot/vmlinuz-{image}").write_text("")
    (tmp_path / "boot/initrd.img-6.8.12-9-pve").write_text("")  # not an image
    (tmp_path / "etc/kernel").mkdir(parents=True)
    (tmp_path / "etc/kernel/proxmox-boot-pin").write_text("6.8.12-9-pve\nignored second line\n")
    (tmp_path / "var/lib/dkms/nvidia/590.48.01/6.8.12-9-pve/x86_64/module").mkdir(parents=True)
    (tmp_path / "var/lib/dkms/nvidia/590.48.01/source").mkdir()  # DKMS's source link: not a build
    command = NextBoot().command(root=str(tmp_path))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    running = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    assert parse_next_boot(done.stdout.splitlines()) == KernelBoot(
        running, ("6.14.8-2-pve", "6.8.12-9-pve"), "6.8.12-9-pve", None, {"6.8.12-9-pve": ("590.48.01",)}
    )
    (tmp_path / "etc/kernel/next-boot-pin").write_text("6.14.8-2-pve")  # no newline, as `echo -n` leaves it
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert parse_next_boot(done.stdout.splitlines()).next_pinned == "6.14.8-2-pve"
    assert "/etc/kernel/next-boot-pin" in NextBoot().command()  # on a host: its own root


def test_parse_lines_of_each_section() -> None:
    lines = [
        "#pvegpu:running", RUNNING, "#pvegpu:next_pin", "#pvegpu:pin", "6.8.12-9-pve",
        "#pvegpu:images", "/boot/vmlinuz-6.8.12-9-pve", "/boot/vmlinuz-6.14.8-2-pve",
        "#pvegpu:dkms", "/var/lib/dkms/nvidia/590.48.01/6.8.12-9-pve/x86_64/module",
        "/var/lib/dkms/nvidia-current-open/550.163.01/6.8.12-9-pve/x86_64/module", "#pvegpu:end",
    ]  # fmt: skip
    assert parse_next_boot(lines) == KernelBoot(
        RUNNING, ("6.8.12-9-pve", "6.14.8-2-pve"), "6.8.12-9-pve", None,
        {"6.8.12-9-pve": ("590.48.01", "550.163.01")},
    )  # fmt: skip
    empty_pin = [*lines[:3], "", *lines[3:]]  # a pin file with an empty first line pins nothing
    assert parse_next_boot(empty_pin).next_pinned is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("/boot/vmlinuz", "next boot: line 7: '/boot/vmlinuz' is not a /boot/vmlinuz-<release> image"),
        ("/var/lib/dkms/other/1.0/6.8.12-9-pve/x86_64/module",
         "next boot: line 7: '/var/lib/dkms/other/1.0/6.8.12-9-pve/x86_64/module' is not a DKMS module build "
         "directory"),
    ],
)  # fmt: skip
def test_error_names_the_line(line: str, message: str) -> None:
    section = "#pvegpu:images" if line.startswith("/boot") else "#pvegpu:dkms"
    lines = ["#pvegpu:running", RUNNING, "#pvegpu:next_pin", "#pvegpu:pin", "#pvegpu:images"]
    lines += [line, "#pvegpu:dkms"] if section == "#pvegpu:images" else ["#pvegpu:dkms", line]
    lines.append("#pvegpu:end")
    with pytest.raises(FactParseError) as caught:
        parse_next_boot(lines)
    assert str(caught.value) == message.replace("line 7", f"line {lines.index(line) + 1}")


class _Host:
    """A host whose `NextBoot` fact is `boot` (the guard reads nothing else)."""

    name = "pve1"

    def __init__(self, boot: KernelBoot) -> None:
        self.boot = boot

    def get_fact(self, fact: type, **_: object) -> KernelBoot:
        assert fact is NextBoot
        return self.boot


def test_reboot_guard_refuses_only_once_the_driver_is_installed() -> None:
    first_install = _Host(boot("6.8.12-9-pve", "6.14.8-2-pve"))
    refuse_kernel_without_module(first_install, "590.48.01", proxmox=True)  # type: ignore[arg-type]
    updated = _Host(boot("6.8.12-9-pve", "6.14.8-2-pve", built={"6.8.12-9-pve": ("590.48.01",)}))
    with pytest.raises(OperationError) as caught:
        refuse_kernel_without_module(updated, "590.48.01", proxmox=True)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "pve1: reboot refused: kernel 6.14.8-2-pve (next boot) has no NVIDIA module 590.48.01 built by DKMS "
        "(built: none): apt install proxmox-headers-6.14.8-2-pve, then dkms autoinstall -k 6.14.8-2-pve; or "
        "pin the running kernel: proxmox-boot-tool kernel pin 6.8.12-9-pve"
    )
    pinned = _Host(boot("6.8.12-9-pve", "6.14.8-2-pve", built={"6.8.12-9-pve": ("590.48.01",)}, pin=RUNNING))
    refuse_kernel_without_module(pinned, "590.48.01", proxmox=True)  # type: ignore[arg-type]


def test_next_boot_report_the_doctors_lines() -> None:
    """A guest's Debian kernels: its next kernel with the module, without it, and before the driver is in."""
    old, new = "6.1.0-28-amd64", "6.1.0-31-amd64"
    both = KernelBoot(old, (old, new), None, None, {old: ("580.95.05",), new: ("580.95.05",)})
    assert next_boot_report(both, "580.95.05", proxmox=False) == (
        True,
        (f"kernel {new}: NVIDIA module 580.95.05 built by DKMS",),
    )
    missing = KernelBoot(old, (old, new), None, None, {old: ("580.95.05",)})
    assert next_boot_report(missing, "580.95.05", proxmox=False, installed_only=True) == (
        False,
        (
            f"kernel {new} (next boot) has no NVIDIA module 580.95.05 built by DKMS (built: none): apt "
            f"install linux-headers-{new}, then dkms autoinstall -k {new}; or keep booting {old} "
            "(GRUB_DEFAULT)",
        ),
    )
    before = KernelBoot(old, (old,), None, None, {})
    assert next_boot_report(before, "580.95.05", proxmox=False, installed_only=True) == (True, ())
    assert next_boot_report(before, "580.95.05", proxmox=False)[0] is False  # the node's doctor says so
