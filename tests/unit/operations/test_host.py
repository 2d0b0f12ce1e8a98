"""Operations of the host role: facts in -> exact commands out, or the noop sentence, or the error."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.boot import KernelCmdline
from pvegpu.facts.node_read import NodeRead
from pvegpu.facts.pvegpu_boot import BootFiles, EspEntries
from pvegpu.models.boot import BootLoaderInfo, BootLoaderKind
from pvegpu.models.hardware import HostHardware
from pvegpu.operations.cmdline import REFRESH_ESPS, UPDATE_GRUB, cmdline_tokens
from pvegpu.operations.files import write_file
from pvegpu.operations.reboot import REBOOT, reboot_if_pending
from pvegpu.operations.vfio import UPDATE_INITRAMFS, render_vfio, vfio_config
from pvegpu.plan.vfio import plan_vfio
from tests.unit.hostdata import two_cards, written_files
from tests.unit.op_harness import node_state, run_op

TOKENS = ("amd_iommu=on", "iommu=pt")
GRUB = BootLoaderInfo(BootLoaderKind.GRUB, (), False, ("/etc/default/grub present",))
SYSTEMD_BOOT = BootLoaderInfo(BootLoaderKind.SYSTEMD_BOOT, ("5A1B-2C3D",), True, ("uefi",))
UNKNOWN = BootLoaderInfo(
    BootLoaderKind.UNKNOWN, (), False, ("/etc/default/grub absent", "update-grub not found")
)
# Synthesized: a fresh Proxmox VE 8 ZFS install's /etc/kernel/cmdline.
FRESH = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n"
GRUB_DROPIN = (
    "# Managed by pvegpu (pve_host role): kernel parameters pvegpu owns. Edit the inventory, not this file;\n"
    "# parameters of your own belong in /etc/default/grub. Applied by update-grub at the next boot.\n"
    'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} amd_iommu=on iommu=pt"\n'
)


# The running command lines of the two layouts before pvegpu (synthesized, Proxmox VE 8 installer shapes).
RUNNING_GRUB = ("BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve", "root=/dev/mapper/pve-root", "ro", "quiet")
RUNNING_ESP = (r"initrd=\EFI\proxmox\6.8.12-4-pve\initrd.img-6.8.12-4-pve", *FRESH.split())
GRUB_CFG_DONE = ((*RUNNING_GRUB[1:], *TOKENS),)
ESP_FRESH = (EspEntries("5A1B-2C3D", (tuple(FRESH.split()),)),)
DONE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on iommu=pt\n"
ESP_DONE = (EspEntries("5A1B-2C3D", (tuple(DONE.split()),)),)
# The consumers of pvegpu's files, each failing with a line naming it (exact text: test_ops_files.py).
GRUB_REFRESH = UPDATE_GRUB.get_raw_value()
ESP_REFRESH = REFRESH_ESPS.get_raw_value()
INITRAMFS_REFRESH = UPDATE_INITRAMFS.get_raw_value()


def cmdline(
    boot: BootLoaderInfo,
    boot_files: BootFiles,
    tokens: tuple[str, ...] = TOKENS,
    running: tuple[str, ...] = RUNNING_ESP,
) -> Any:
    return run_op(
        cmdline_tokens, {NodeRead: node_state(cmdline=running)}, tokens=tokens, boot=boot, files=boot_files
    )


def written(path: str, content: str, check: str | None = None) -> str:
    return write_file(path, content, check=check).get_raw_value()


# --- cmdline_tokens: GRUB ---------------------------------------------------------------------


def test_create_grub_dropin_checked_then_update_grub() -> None:
    commands, noops = cmdline(GRUB, written_files(grub_cfg_lines=(RUNNING_GRUB[1:],)))
    assert commands == [written("/etc/default/grub.d/pvegpu.cfg", GRUB_DROPIN, "sh -n"), GRUB_REFRESH]
    assert "&& sh -n /etc/default/grub.d/.pvegpu.cfg.pvegpu-new && mv -f" in str(commands[0])
    assert noops == []


def test_noop_grub_dropin_already_adds_the_tokens_and_grub_cfg_has_them() -> None:
    done = written_files(grub_dropin=GRUB_DROPIN, grub_cfg_lines=GRUB_CFG_DONE, grub_cfg_current=True)
    commands, noops = cmdline(GRUB, done)
    assert commands == []
    assert noops == [
        "/etc/default/grub.d/pvegpu.cfg already adds amd_iommu=on iommu=pt, and /boot/grub/grub.cfg has them"
    ]


@pytest.mark.parametrize(
    ("grub_cfg_lines", "current"),
    [
        (None, False),  # cut before update-grub wrote any grub.cfg
        ((RUNNING_GRUB[1:],), False),  # drop-in written, update-grub never ran
        (((*RUNNING_GRUB[1:], "amd_iommu=on"), (*RUNNING_GRUB[1:], *TOKENS)), True),  # an entry lacks one
        (((*RUNNING_GRUB[1:], *TOKENS, "pcie_aspm=off"),), False),  # a dropped token still in grub.cfg
    ],
    ids=["no-grub-cfg", "never-refreshed", "entry-lacks-token", "older-than-dropin"],
)
def test_drift_grub_cfg_behind_the_dropin_runs_update_grub_only(
    grub_cfg_lines: tuple[tuple[str, ...], ...] | None, current: bool
) -> None:
    files = written_files(grub_dropin=GRUB_DROPIN, grub_cfg_lines=grub_cfg_lines, grub_cfg_current=current)
    commands, noops = cmdline(GRUB, files)
    assert (commands, noops) == ([GRUB_REFRESH], [])


def test_update_grub_dropin_drops_a_token_removed_from_the_spec() -> None:
    with_extra = GRUB_DROPIN.replace("iommu=pt", "iommu=pt pcie_aspm=off")
    commands, _ = cmdline(GRUB, written_files(grub_dropin=with_extra, grub_cfg_current=True))
    assert commands == [written("/etc/default/grub.d/pvegpu.cfg", GRUB_DROPIN, "sh -n"), GRUB_REFRESH]


# --- cmdline_tokens: systemd-boot -------------------------------------------------------------


def test_create_systemd_boot_backs_up_once_records_owned_tokens_and_refreshes() -> None:
    commands, noops = cmdline(SYSTEMD_BOOT, written_files(kernel_cmdline=FRESH, esps=ESP_FRESH))
    assert commands == [
        written("/etc/kernel/cmdline.pvegpu-orig", FRESH),
        "mkdir -p /etc/pvegpu",
        written("/etc/pvegpu/cmdline-tokens", "amd_iommu=on\niommu=pt\n"),
        written("/etc/kernel/cmdline", DONE),
        ESP_REFRESH,
    ]
    assert noops == []


def test_noop_systemd_boot_already_has_the_tokens() -> None:
    done = written_files(kernel_cmdline=DONE, backup=FRESH, owned_tokens=TOKENS, esps=ESP_DONE)
    commands, noops = cmdline(SYSTEMD_BOOT, done, running=(*RUNNING_ESP, *TOKENS))
    assert commands == []
    assert noops == ["/etc/kernel/cmdline already has amd_iommu=on iommu=pt, and every ESP boots with it"]


@pytest.mark.parametrize(
    "esps",
    [
        ESP_FRESH,  # cut before proxmox-boot-tool refresh
        (*ESP_DONE, EspEntries("5A1B-9999", (tuple(FRESH.split()),))),  # refresh cut after the first ESP
        (EspEntries("5A1B-2C3D", ()),),  # no proxmox entry
        (EspEntries("5A1B-2C3D", (), readable=False),),
    ],
    ids=["never-refreshed", "second-esp-behind", "no-entry", "unreadable"],
)
def test_drift_esp_behind_kernel_cmdline_refreshes_only(esps: tuple[EspEntries, ...]) -> None:
    files = written_files(kernel_cmdline=DONE, backup=FRESH, owned_tokens=TOKENS, esps=esps)
    commands, noops = cmdline(SYSTEMD_BOOT, files)
    assert (commands, noops) == ([ESP_REFRESH], [])


def test_update_systemd_boot_removes_only_its_own_token_and_keeps_the_backup() -> None:
    before = written_files(
        kernel_cmdline="root=ZFS=rpool/ROOT/pve-1 mitigations=off amd_iommu=on iommu=pt pcie_aspm=off\n",
        backup="root=ZFS=rpool/ROOT/pve-1 mitigations=off\n",
        owned_tokens=(*TOKENS, "pcie_aspm=off"),
    )
    running = ("root=ZFS=rpool/ROOT/pve-1", "mitigations=off", *TOKENS, "pcie_aspm=off")
    commands, _ = cmdline(SYSTEMD_BOOT, before, running=running)
    assert commands == [
        "mkdir -p /etc/pvegpu",
        written("/etc/pvegpu/cmdline-tokens", "amd_iommu=on\niommu=pt\n"),
        written("/etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 mitigations=off amd_iommu=on iommu=pt\n"),
        ESP_REFRESH,
    ]


def test_update_systemd_boot_users_own_token_is_not_taken_over() -> None:
    users = written_files(kernel_cmdline="root=ZFS=rpool/ROOT/pve-1 iommu=pt\n", backup=FRESH)
    commands, _ = cmdline(SYSTEMD_BOOT, users, running=("root=ZFS=rpool/ROOT/pve-1", "iommu=pt"))
    assert commands == [
        "mkdir -p /etc/pvegpu",
        written("/etc/pvegpu/cmdline-tokens", "amd_iommu=on\n"),
        written("/etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 iommu=pt amd_iommu=on\n"),
        ESP_REFRESH,
    ]


@pytest.mark.parametrize(
    ("damaged", "damage"),
    [
        ("", "empty"),
        ("\n", "empty"),
        ('root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet foo="a b\n', "cut off (an unclosed quote)"),
        ("amd_iommu=on iommu=pt\n", "without root="),
        ("root=ZFS=rpool/ROOT/pve-1 bo\n", "cut off (a prefix of the running command line)"),
    ],
)
def test_drift_damaged_kernel_cmdline_is_restored_from_the_running_line(
    damaged: str, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    files = written_files(kernel_cmdline=damaged, backup=FRESH, owned_tokens=TOKENS, esps=ESP_DONE)
    commands, noops = cmdline(SYSTEMD_BOOT, files, running=(*RUNNING_ESP, *TOKENS))
    assert commands == [written("/etc/kernel/cmdline", DONE), ESP_REFRESH]
    assert noops == []
    assert caplog.messages == [
        f"[pve1] /etc/kernel/cmdline is {damage}: restoring it from the running kernel's command line: "
        "'root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet'"
    ]


def test_drift_empty_kernel_cmdline_without_backup_is_restored_and_backed_up_from_the_running_line() -> None:
    files = written_files(kernel_cmdline="", esps=ESP_FRESH)
    commands, _ = cmdline(SYSTEMD_BOOT, files)
    assert commands == [
        written("/etc/kernel/cmdline.pvegpu-orig", FRESH),
        "mkdir -p /etc/pvegpu",
        written("/etc/pvegpu/cmdline-tokens", "amd_iommu=on\niommu=pt\n"),
        written("/etc/kernel/cmdline", DONE),
        ESP_REFRESH,
    ]


def test_drift_damaged_kernel_cmdline_restored_from_the_backup_when_the_running_line_has_no_root() -> None:
    files = written_files(kernel_cmdline="", backup=FRESH, owned_tokens=TOKENS, esps=ESP_DONE)
    commands, _ = cmdline(SYSTEMD_BOOT, files, running=("quiet", *TOKENS))
    assert commands == [written("/etc/kernel/cmdline", DONE), ESP_REFRESH]


@pytest.mark.parametrize(
    ("boot", "boot_files", "running", "message"),
    [
        (
            UNKNOWN,
            written_files(),
            RUNNING_ESP,
            "pve1: bootloader unknown, so no kernel command line is written: "
            "/etc/default/grub absent; update-grub not found",
        ),
        (
            SYSTEMD_BOOT,
            written_files(),
            RUNNING_ESP,
            "pve1: systemd-boot without /etc/kernel/cmdline: no command line to add amd_iommu=on iommu=pt to",
        ),
        (
            SYSTEMD_BOOT,
            written_files(kernel_cmdline="\n", backup="\n"),
            ("quiet",),
            "pve1: /etc/kernel/cmdline is empty, and neither the running command line nor "
            "/etc/kernel/cmdline.pvegpu-orig can restore it (no root=): write it by hand",
        ),
        (
            SYSTEMD_BOOT,
            written_files(kernel_cmdline="root=ZFS=rpool/ROOT/pve-1 quiet\n", backup=FRESH),
            RUNNING_ESP,
            "pve1: not writing /etc/kernel/cmdline 'root=ZFS=rpool/ROOT/pve-1 quiet amd_iommu=on iommu=pt': "
            "without pvegpu's tokens it is shorter than the running kernel's "
            "('root=ZFS=rpool/ROOT/pve-1 quiet' < 'root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet'); "
            "fix /etc/kernel/cmdline by hand (the running line is in /proc/cmdline)",
        ),
        (
            SYSTEMD_BOOT,
            written_files(kernel_cmdline=f"root=ZFS=rpool/ROOT/pve-1 {'x' * 2020}\n", backup=FRESH),
            ("root=ZFS=rpool/ROOT/pve-1",),
            f"pve1: not writing /etc/kernel/cmdline 'root=ZFS=rpool/ROOT/pve-1 {'x' * 2020} amd_iommu=on "
            "iommu=pt': it is 2068 bytes, the kernel keeps 2047; "
            "fix /etc/kernel/cmdline by hand (the running line is in /proc/cmdline)",
        ),
    ],
    ids=["unknown", "no-kernel-cmdline", "unrestorable", "shorter-than-running", "over-the-limit"],
)
def test_error_cmdline_refuses_what_it_cannot_apply(
    boot: BootLoaderInfo, boot_files: BootFiles, running: tuple[str, ...], message: str
) -> None:
    with pytest.raises(OperationError) as raised:
        cmdline(boot, boot_files, running=running)
    assert str(raised.value) == message


# --- vfio_config -------------------------------------------------------------------------------

ALL = ("0000:41:00.0", "0000:41:00.1", "0000:51:00.0", "0000:51:00.1")
MODULES_6_8 = (
    "# Managed by pvegpu (pve_host role): load VFIO at boot, for GPU passthrough.\n"
    "vfio\nvfio_iommu_type1\nvfio_pci\n"
)
SOFTDEPS_AND_BLACKLIST = (
    "softdep nouveau pre: vfio-pci\n"
    "softdep nvidia pre: vfio-pci\n"
    "blacklist nouveau\n"
    "blacklist nvidia\n"
    "blacklist nvidia_drm\n"
    "blacklist nvidia_modeset\n"
    "blacklist nvidia_uvm\n"
    "blacklist nvidiafb\n"
)
HEADER = "# Managed by pvegpu (pve_host role): the functions of the selected GPUs go to vfio-pci at boot.\n"
MODPROBE_IDS = HEADER + "options vfio-pci ids=10de:22e8,10de:2bb1\n" + SOFTDEPS_AND_BLACKLIST


def test_render_by_ids_on_kernel_6_8() -> None:
    assert render_vfio(plan_vfio(two_cards(), ALL, (6, 8))) == {
        "/etc/modules-load.d/pvegpu-vfio.conf": MODULES_6_8,
        "/etc/modprobe.d/pvegpu-vfio.conf": MODPROBE_IDS,
    }


def test_render_by_address_on_kernel_6_1_with_virqfd() -> None:
    rendered = render_vfio(plan_vfio(two_cards(), ALL[:2], (6, 1)))
    assert rendered["/etc/modules-load.d/pvegpu-vfio.conf"] == MODULES_6_8 + "vfio_virqfd\n"
    assert rendered["/etc/modprobe.d/pvegpu-vfio.conf"] == (
        HEADER + "# Some functions share their ids with functions that stay on the host: bind by address.\n"
        "install vfio-pci for a in 0000:41:00.0 0000:41:00.1; do echo vfio-pci > "
        "/sys/bus/pci/devices/$a/driver_override; done; "
        "/sbin/modprobe --ignore-install vfio-pci $CMDLINE_OPTS\n" + SOFTDEPS_AND_BLACKLIST
    )


def vfio(boot_files: BootFiles, functions: tuple[str, ...] = ALL) -> Any:
    return run_op(vfio_config, {}, plan=plan_vfio(two_cards(), functions, (6, 8)), files=boot_files)


def test_create_vfio_dropins_then_update_initramfs() -> None:
    commands, noops = vfio(written_files())
    assert commands == [
        written("/etc/modules-load.d/pvegpu-vfio.conf", MODULES_6_8),
        written("/etc/modprobe.d/pvegpu-vfio.conf", MODPROBE_IDS),
        INITRAMFS_REFRESH,
    ]
    assert noops == []


def test_drift_initramfs_older_than_the_dropins_is_rebuilt_only() -> None:
    stale = written_files(
        modules_load=MODULES_6_8, modprobe=MODPROBE_IDS, stale_initramfs=("initrd.img-6.8.12-4-pve",)
    )
    assert vfio(stale) == ([INITRAMFS_REFRESH], [])


def test_drift_initramfs_older_than_a_removal_is_rebuilt_only() -> None:
    stale = written_files(stale_initramfs=("initrd.img-6.8.12-4-pve",))
    assert run_op(vfio_config, {}, files=stale, present=False) == ([INITRAMFS_REFRESH], [])


def test_noop_vfio_absent_and_initramfs_current() -> None:
    assert run_op(vfio_config, {}, files=written_files(), present=False) == (
        [],
        [
            "/etc/modules-load.d/pvegpu-vfio.conf and /etc/modprobe.d/pvegpu-vfio.conf are absent: "
            "nothing binds GPUs to vfio-pci at boot"
        ],
    )


def test_noop_vfio_dropins_match() -> None:
    commands, noops = vfio(written_files(modules_load=MODULES_6_8, modprobe=MODPROBE_IDS))
    assert commands == []
    assert noops == [
        "/etc/modules-load.d/pvegpu-vfio.conf and /etc/modprobe.d/pvegpu-vfio.conf already bind "
        "ids 10de:22e8,10de:2bb1 to vfio-pci"
    ]


def test_update_only_the_changed_dropin_then_update_initramfs() -> None:
    commands, _ = vfio(written_files(modules_load=MODULES_6_8, modprobe=MODPROBE_IDS), functions=ALL[:2])
    modprobe = render_vfio(plan_vfio(two_cards(), ALL[:2], (6, 8)))["/etc/modprobe.d/pvegpu-vfio.conf"]
    assert commands == [written("/etc/modprobe.d/pvegpu-vfio.conf", modprobe), INITRAMFS_REFRESH]


# --- reboot_if_pending -------------------------------------------------------------------------

RUNNING_OLD = ("BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve", "root=/dev/mapper/pve-root", "ro", "quiet")
RUNNING_NEW = (*RUNNING_OLD, *TOKENS)


def reboot(running: tuple[str, ...], hw: HostHardware, allow: bool, functions: tuple[str, ...] = ALL) -> Any:
    return run_op(
        reboot_if_pending,
        {NodeRead: node_state(cmdline=running)},
        hardware=hw,
        tokens=TOKENS,
        functions=functions,
        allow_reboot=allow,
        timeout_s=60,
    )


def test_noop_nothing_pending() -> None:
    commands, noops = reboot(RUNNING_NEW, two_cards(driver="vfio-pci"), allow=True)
    assert commands == []
    assert noops == [
        "no reboot needed: the running kernel has amd_iommu=on iommu=pt and "
        "4 GPU functions are bound to vfio-pci"
    ]


def test_noop_pending_but_not_allowed_says_exactly_what_is_pending() -> None:
    running = (*RUNNING_OLD, "amd_iommu=on")
    commands, noops = reboot(running, two_cards(), allow=False, functions=ALL[:1])
    assert commands == []
    assert noops == [
        "reboot required: /proc/cmdline lacks iommu=pt; 0000:41:00.0 still bound to nvidia "
        "(pve_host.allow_reboot is false: not rebooting)"
    ]


def test_pending_and_allowed_reboots_then_waits_and_verifies() -> None:
    commands, noops = reboot(RUNNING_OLD, two_cards(), allow=True)
    assert commands[0] == REBOOT == "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"
    assert isinstance(commands[1], FunctionCommand)
    assert len(commands) == 2
    assert noops == []


class Rebooting:
    """A host that answers the old state `stale` times after reconnecting, then the new one."""

    def __init__(self, stale: int, new_hw: HostHardware) -> None:
        self.connected = True
        self.reads = 0
        self.logged: list[str] = []
        self.stale = stale
        self.new_hw = new_hw

    def disconnect(self) -> None:
        self.connected = False

    def connect(self, **_kwargs: Any) -> None:
        self.connected = True

    def log_styled(self, message: str, **_kwargs: Any) -> None:
        self.logged.append(message)

    def get_fact(self, fact: type, **_kwargs: Any) -> object:
        fresh = self.reads >= 2 * self.stale  # two facts per poll
        self.reads += 1
        if fact is KernelCmdline:
            return RUNNING_NEW if fresh else RUNNING_OLD
        return self.new_hw if fresh else two_cards()


def wait_function(timeout_s: float) -> Any:
    commands, _ = run_op(
        reboot_if_pending,
        {NodeRead: node_state(cmdline=RUNNING_OLD)},
        hardware=two_cards(),
        tokens=TOKENS,
        functions=ALL,
        allow_reboot=True,
        timeout_s=timeout_s,
    )
    command = commands[1]
    assert isinstance(command, FunctionCommand)
    return command.function


def test_wait_polls_until_the_new_state_is_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.reboot.time.sleep", lambda _s: None)
    target = Rebooting(stale=2, new_hw=two_cards(driver="vfio-pci"))
    assert wait_function(60)(None, target) is True
    assert (target.reads, target.logged) == (6, [])


def test_error_still_pending_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.reboot.time.sleep", lambda _s: None)
    target = Rebooting(stale=0, new_hw=two_cards(driver="nvidia"))
    # The host fails in one logged line (pyinfra stops its later commands), with no traceback.
    assert wait_function(0.05)(None, target) is False
    assert target.logged == [
        "after reboot, 0 s: reboot required: 0000:41:00.0, 0000:51:00.0 still bound to nvidia; "
        "0000:41:00.1, 0000:51:00.1 still bound to snd_hda_intel"
    ]
