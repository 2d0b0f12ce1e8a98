"""Boot facts: kernel command line, bootloader detection, Proxmox release.

Evidence: real /proc/cmdline captures (a fixture of ours and shared/fixtures/real-kernel), real
`proxmox-boot-tool status` and `pveversion` outputs quoted from public user sessions (sources at each case),
and the commands run on this machine through pyinfra. Synthesized cases are labelled as such.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import pytest
from pyinfra.api.facts import get_fact

from pvegpu.facts.boot import (
    BootLoader,
    KernelCmdline,
    PveVersion,
    parse_boot_loader,
    parse_cmdline,
    parse_pveversion,
)
from pvegpu.facts.errors import FactParseError
from pvegpu.models.boot import BootLoaderInfo, BootLoaderKind, PveRelease
from tests.unit import realdata
from tests.unit.pyinfra_local import local_state

FIXTURES = Path(__file__).parents[1] / "fixtures"
ESP_LIST = "/etc/kernel/proxmox-boot-uuids"

# --- KernelCmdline ----------------------------------------------------------------------------------------


def test_cmdline_command_quotes_the_path() -> None:
    assert KernelCmdline().command() == "cat -- /proc/cmdline"
    assert KernelCmdline().command(cmdline_path="/srv/captured cmdline") == "cat -- '/srv/captured cmdline'"


def test_cmdline_of_a_real_vm_with_init_arguments() -> None:
    lines = (FIXTURES / "proc_cmdline_sandbox_vm.txt").read_text().splitlines()[1:]
    tokens = parse_cmdline(lines)
    assert tokens[:4] == (
        "mitigations=auto,no_guest_host,no_guest_guest",
        "console=ttyS0",
        "quiet",
        "reboot=k",
    )
    assert tokens[16:19] == ("rdinit=/process_api", "--", "--firecracker-init")
    assert tokens[-1] == "--auth-required"
    assert len(tokens) == 32


def test_cmdline_of_a_real_kernel_with_iommu() -> None:
    """shared/fixtures/real-kernel: QEMU q35 + intel-iommu, Linux 6.1; the CMDLINE line is /proc/cmdline."""
    shared = Path(os.environ.get("PVEGPU_SHARED", realdata.REPO.parent / "shared"))
    path = shared / "fixtures/real-kernel/qemu-q35-intel-iommu-linux-6.1-probe.txt"
    if not path.is_file():
        pytest.skip(f"real capture {path} not found (set PVEGPU_SHARED to the shared folder)")
    line = next(line for line in path.read_text().splitlines() if line.startswith("CMDLINE "))
    assert parse_cmdline([line.removeprefix("CMDLINE ")]) == (
        "console=ttyS0",
        "loglevel=3",
        "panic=-1",
        "intel_iommu=on",
        "iommu=pt",
    )


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        # Synthesized, in the kernel's quoting rules (lib/cmdline.c next_arg): quotes group, and are kept.
        (
            'BOOT_IMAGE=/boot/vmlinuz-6.8.12-1-pve root=ZFS=rpool/ROOT/pve-1 dyndbg="file pci.c +p" quiet',
            (
                "BOOT_IMAGE=/boot/vmlinuz-6.8.12-1-pve",
                "root=ZFS=rpool/ROOT/pve-1",
                'dyndbg="file pci.c +p"',
                "quiet",
            ),
        ),
        ('a "b c', ("a", '"b c')),  # an unclosed quote runs to the end, as in the kernel
        ("", ()),
    ],
)
def test_cmdline_tokens(text: str, tokens: tuple[str, ...]) -> None:
    assert parse_cmdline([text]) == tokens


def test_cmdline_through_pyinfra(tmp_path: Path) -> None:
    path = tmp_path / "cmd line"
    path.write_text("root=/dev/sda1 amd_iommu=on iommu=pt\n")
    state, local = local_state()
    assert get_fact(state, local, KernelCmdline, kwargs={"cmdline_path": str(path)}) == (
        "root=/dev/sda1",
        "amd_iommu=on",
        "iommu=pt",
    )


def test_cmdline_missing_file_fails_the_host(tmp_path: Path) -> None:
    state, local = local_state("other.invalid")
    assert get_fact(state, local, KernelCmdline, kwargs={"cmdline_path": str(tmp_path / "nope")}) == ()
    assert state.failed_hosts == {local}


# --- PveVersion ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "release"),
    [
        # The issue text's example (PVE 8.2.4).
        (
            "pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.12-1-pve)",
            PveRelease("8.2.4", "faa83925c9641325", "6.8.12-1-pve"),
        ),
        # A user's session `root@pve:~# pveversion` quoted in a public write-up (PVE 8.3.2).
        (
            "pve-manager/8.3.2/3e76eec21c4a14a7 (running kernel: 6.8.12-6-pve)",
            PveRelease("8.3.2", "3e76eec21c4a14a7", "6.8.12-6-pve"),
        ),
    ],
)
def test_pveversion(line: str, release: PveRelease) -> None:
    assert parse_pveversion([line]) == release


def test_pve_release_major_minor_without_a_numeric_minor() -> None:
    assert PveRelease("8.2.4", "faa83925c9641325", "6.8.12-1-pve").major_minor == (8, 2)
    assert PveRelease("8.1.3", "b", "k").major_minor == (8, 1)
    assert PveRelease("9", "b", "k").major_minor == (9, 0)
    assert PveRelease("8.x", "b", "k").major_minor == (8, 0)


def test_pveversion_absent_is_none() -> None:
    assert parse_pveversion([]) is None


PVEVERSION_EXPECTED = "pveversion: expected 'pve-manager/<version>/<build> (running kernel: <kernel>)', got "


@pytest.mark.parametrize(
    "lines",
    [
        ["pve-manager/8.2.4"],
        ["proxmox-ve: 8.2.0 (running kernel: 6.8.12-2-pve)", "pve-manager: 8.2.4"],  # that is `pveversion -v`
    ],
)
def test_pveversion_garbled(lines: list[str]) -> None:
    with pytest.raises(FactParseError, match="^" + re.escape(PVEVERSION_EXPECTED + repr(lines)) + "$"):
        parse_pveversion(lines)


def test_pveversion_command() -> None:
    assert PveVersion().command() == "if command -v pveversion >/dev/null 2>&1; then pveversion; fi"


def test_pveversion_through_pyinfra_with_and_without_pveversion(tmp_path: Path) -> None:
    """A stand-in `pveversion` (prints the issue's example line) on PATH, then an empty PATH."""
    if shutil.which("pveversion"):
        pytest.skip("this machine runs Proxmox: the 'absent' case cannot be shown here")
    stand_in = tmp_path / "pveversion"
    stand_in.write_text(
        "#!/bin/sh\necho 'pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.12-1-pve)'\n"
    )
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    state, local = local_state()
    with_it = {"_env": {"PATH": f"{tmp_path}:{os.environ['PATH']}"}}
    assert get_fact(state, local, PveVersion, kwargs=with_it) == PveRelease(
        "8.2.4", "faa83925c9641325", "6.8.12-1-pve"
    )
    assert get_fact(state, local, PveVersion) is None


# --- BootLoader ---------------------------------------------------------------------------------------------


def boot_output(
    files: tuple[str, ...], commands: tuple[str, ...], esps: tuple[str, ...], status: tuple[str, ...]
) -> list[str]:
    """What BootLoader's command prints for the given observations."""
    return [
        "#pvegpu:files",
        *files,
        "#pvegpu:commands",
        *commands,
        "#pvegpu:esps",
        *esps,
        "#pvegpu:status",
        *status,
        "#pvegpu:end",
    ]


PBT = ("proxmox-boot-tool", "update-grub")
CLASSIC_GRUB_EVIDENCE = (
    f"{ESP_LIST} absent",
    "/etc/default/grub present",
    "update-grub found",
    "/etc/kernel/cmdline absent",
)
NOTHING_EVIDENCE = (
    f"{ESP_LIST} absent",
    "/etc/default/grub absent",
    "update-grub not found",
    "/etc/kernel/cmdline absent",
)
REEXEC = "Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace.."
HP1_ESPS = ("6D31-87F4", "CE07-1118", "CE07-78FC")
# Real: `root@hp1:~# proxmox-boot-tool status` (ZFS mirror, one dead disk) in a public write-up.
HP1_STATUS = (
    REEXEC,
    "System currently booted with uefi",
    "WARN: /dev/disk/by-uuid/CE07-1118 does not exist - clean '/etc/kernel/proxmox-boot-uuids'! - skipping",
    "6D31-87F4 is configured with: uefi (versions: 5.13.19-6-pve, 5.15.39-3-pve, 5.15.83-1-pve)",
    "CE07-78FC is configured with: uefi (versions: 5.13.19-6-pve, 5.15.39-3-pve, 5.15.83-1-pve)",
)
# Real: `root@pve01:~# proxmox-boot-tool status` on a legacy-BIOS ZFS host, in a public LUKS guide.
PVE01_GRUB_STATUS = (
    REEXEC,
    "System currently booted with legacy bios",
    "865E-6ADE is configured with: grub (versions: 6.8.12-4-pve, 6.8.12-8-pve)",
)

BOOT_CASES = [
    pytest.param(
        boot_output((ESP_LIST, "/etc/kernel/cmdline"), PBT, HP1_ESPS, HP1_STATUS),
        BootLoaderInfo(
            kind=BootLoaderKind.SYSTEMD_BOOT,
            esp_uuids=HP1_ESPS,
            kernel_cmdline_file=True,
            evidence=(
                f"{ESP_LIST} lists 3 ESP(s): 6D31-87F4, CE07-1118, CE07-78FC",
                *(f"proxmox-boot-tool status: {line}" for line in HP1_STATUS),
                "/etc/kernel/cmdline present",
            ),
        ),
        id="real-systemd-boot-zfs-mirror",
    ),
    pytest.param(
        boot_output((ESP_LIST, "/etc/default/grub"), PBT, ("865E-6ADE",), PVE01_GRUB_STATUS),
        BootLoaderInfo(
            kind=BootLoaderKind.GRUB,
            esp_uuids=("865E-6ADE",),
            kernel_cmdline_file=False,
            evidence=(
                f"{ESP_LIST} lists 1 ESP(s): 865E-6ADE",
                *(f"proxmox-boot-tool status: {line}" for line in PVE01_GRUB_STATUS),
                "/etc/kernel/cmdline absent",
            ),
        ),
        id="real-grub-legacy-bios-zfs",
    ),
    pytest.param(
        boot_output(("/etc/default/grub",), ("update-grub",), (), ()),
        BootLoaderInfo(
            kind=BootLoaderKind.GRUB,
            esp_uuids=(),
            kernel_cmdline_file=False,
            evidence=CLASSIC_GRUB_EVIDENCE,
        ),
        id="classic-grub",
    ),
    pytest.param(
        boot_output((ESP_LIST, "/etc/default/grub", "/etc/kernel/cmdline"), PBT, (), ()),
        BootLoaderInfo(
            kind=BootLoaderKind.GRUB,
            esp_uuids=(),
            kernel_cmdline_file=True,
            evidence=(
                f"{ESP_LIST} lists no ESP",
                "/etc/default/grub present",
                "update-grub found",
                "/etc/kernel/cmdline present",
            ),
        ),
        id="empty-esp-list-is-classic-grub",
    ),
    pytest.param(
        boot_output((), (), (), ()),
        BootLoaderInfo(
            kind=BootLoaderKind.UNKNOWN,
            esp_uuids=(),
            kernel_cmdline_file=False,
            evidence=NOTHING_EVIDENCE,
        ),
        id="nothing-known",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "info"), BOOT_CASES)
def test_boot_loader(lines: list[str], info: BootLoaderInfo) -> None:
    assert parse_boot_loader(lines) == info


# Synthesized `proxmox-boot-tool status` bodies in the tool's own format (src/bin/proxmox-boot-tool, status).
UEFI = "System currently booted with uefi"
LEGACY = "System currently booted with legacy bios"
BOTH = "AAAA-0001 is configured with: uefi (versions: 6.8.12-1-pve), grub (versions: 6.8.12-1-pve)"


@pytest.mark.parametrize(
    ("status", "commands", "kind", "last_evidence"),
    [
        ((UEFI, BOTH), PBT, BootLoaderKind.UNKNOWN,
         "an ESP's loaders do not decide the bootloader on a uefi boot"),
        ((LEGACY, BOTH), PBT, BootLoaderKind.GRUB, f"proxmox-boot-tool status: {BOTH}"),
        (
            (UEFI, "AAAA-0001 is configured with: uefi (versions: 6.8.12-1-pve)",
             "AAAA-0002 is configured with: grub (versions: 6.8.12-1-pve)"),
            PBT, BootLoaderKind.UNKNOWN, "the ESPs do not agree on one bootloader",
        ),
        (
            (UEFI, "mount of /dev/disk/by-uuid/AAAA-0001 failed - skipping"),
            PBT, BootLoaderKind.UNKNOWN,
            "proxmox-boot-tool status reported no boot mode or no configured ESP",
        ),
        ((), ("update-grub",), BootLoaderKind.UNKNOWN, "proxmox-boot-tool not found on PATH"),
    ],
)  # fmt: skip
def test_boot_loader_never_guesses(
    status: tuple[str, ...], commands: tuple[str, ...], kind: BootLoaderKind, last_evidence: str
) -> None:
    info = parse_boot_loader(boot_output((ESP_LIST,), commands, ("AAAA-0001",), status))
    assert info.kind is kind
    assert info.evidence[-2] == last_evidence  # the last one is always the /etc/kernel/cmdline observation


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (boot_output(("/etc/fstab",), (), (), ()),
         "line 2: expected one of /etc/kernel/proxmox-boot-uuids, /etc/kernel/cmdline, /etc/default/grub, "
         "got '/etc/fstab'"),
        (boot_output((), (), (), ())[:-1], "truncated output: the #pvegpu:end marker is missing"),
        ([], "truncated output: the #pvegpu:files marker is missing"),
    ],
)  # fmt: skip
def test_boot_loader_garbled(lines: list[str], message: str) -> None:
    with pytest.raises(FactParseError, match="^" + re.escape(message) + "$"):
        parse_boot_loader(lines)


def test_boot_loader_command() -> None:
    assert BootLoader().command() == (
        "echo '#pvegpu:files'; "
        "for f in /etc/kernel/proxmox-boot-uuids /etc/kernel/cmdline /etc/default/grub; "
        'do if [ -e "$f" ]; then echo "$f"; fi; done; '
        "echo '#pvegpu:commands'; "
        "for c in proxmox-boot-tool update-grub; "
        'do if command -v "$c" >/dev/null 2>&1; then echo "$c"; fi; done; '
        "echo '#pvegpu:esps'; "
        "grep -s . /etc/kernel/proxmox-boot-uuids; "
        "echo '#pvegpu:status'; "
        "if [ -s /etc/kernel/proxmox-boot-uuids ] && command -v proxmox-boot-tool >/dev/null 2>&1; "
        "then proxmox-boot-tool status 2>&1; fi; "
        "echo '#pvegpu:end'"
    )


def test_boot_loader_on_this_machine() -> None:
    """The real command through pyinfra agrees with what Python sees of this machine's files and PATH."""
    if shutil.which("proxmox-boot-tool"):
        pytest.skip("proxmox-boot-tool present: its status output is host-specific")
    state, local = local_state()
    info = get_fact(state, local, BootLoader)
    grub = Path("/etc/default/grub").exists()
    update_grub = shutil.which("update-grub") is not None
    cmdline = Path("/etc/kernel/cmdline").exists()
    esp_state = "lists no ESP" if Path(ESP_LIST).exists() else "absent"
    if Path(ESP_LIST).exists() and Path(ESP_LIST).read_text().strip():
        pytest.skip(f"{ESP_LIST} lists ESPs but proxmox-boot-tool is absent")
    assert info == BootLoaderInfo(
        kind=BootLoaderKind.GRUB if grub and update_grub else BootLoaderKind.UNKNOWN,
        esp_uuids=(),
        kernel_cmdline_file=cmdline,
        evidence=(
            f"{ESP_LIST} {esp_state}",
            f"/etc/default/grub {'present' if grub else 'absent'}",
            f"update-grub {'found' if update_grub else 'not found'}",
            f"/etc/kernel/cmdline {'present' if cmdline else 'absent'}",
        ),
    )


def test_boot_loader_json_for_pyinfra_fact_command() -> None:
    info = parse_boot_loader(boot_output(("/etc/default/grub",), ("update-grub",), (), ()))
    assert info.to_json() == {
        "kind": "grub",
        "esp_uuids": (),
        "kernel_cmdline_file": False,
        "evidence": CLASSIC_GRUB_EVIDENCE,
    }  # fmt: skip
