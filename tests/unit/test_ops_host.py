"""Operations of the host role: facts in -> exact commands out, or the noop sentence, or the error."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.boot import KernelCmdline
from pvegpu.facts.pvegpu_boot import BootFiles
from pvegpu.models.boot import BootLoaderInfo, BootLoaderKind
from pvegpu.models.hardware import HostHardware
from pvegpu.operations.cmdline import cmdline_tokens
from pvegpu.operations.reboot import REBOOT, reboot_if_pending
from pvegpu.operations.vfio import render_vfio, vfio_config
from pvegpu.plan.vfio import plan_vfio
from tests.unit.hostdata import two_cards, written_files
from tests.unit.op_harness import run_op

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


def cmdline(boot: BootLoaderInfo, boot_files: BootFiles, tokens: tuple[str, ...] = TOKENS) -> Any:
    return run_op(cmdline_tokens, {}, tokens=tokens, boot=boot, files=boot_files)


# --- cmdline_tokens: GRUB ---------------------------------------------------------------------


def test_create_grub_dropin_then_update_grub() -> None:
    commands, noops = cmdline(GRUB, written_files())
    assert commands == [f"printf %s '{GRUB_DROPIN}' > /etc/default/grub.d/pvegpu.cfg", "update-grub"]
    assert noops == []


def test_noop_grub_dropin_already_adds_the_tokens() -> None:
    commands, noops = cmdline(GRUB, written_files(grub_dropin=GRUB_DROPIN))
    assert commands == []
    assert noops == ["/etc/default/grub.d/pvegpu.cfg already adds amd_iommu=on iommu=pt"]


def test_update_grub_dropin_drops_a_token_removed_from_the_spec() -> None:
    with_extra = GRUB_DROPIN.replace("iommu=pt", "iommu=pt pcie_aspm=off")
    commands, _ = cmdline(GRUB, written_files(grub_dropin=with_extra))
    assert commands == [f"printf %s '{GRUB_DROPIN}' > /etc/default/grub.d/pvegpu.cfg", "update-grub"]


# --- cmdline_tokens: systemd-boot -------------------------------------------------------------


def test_create_systemd_boot_backs_up_once_records_owned_tokens_and_refreshes() -> None:
    commands, noops = cmdline(SYSTEMD_BOOT, written_files(kernel_cmdline=FRESH))
    assert commands == [
        "cp -p /etc/kernel/cmdline /etc/kernel/cmdline.pvegpu-orig",
        "mkdir -p /etc/pvegpu",
        "printf %s 'amd_iommu=on\niommu=pt\n' > /etc/pvegpu/cmdline-tokens",
        "printf %s 'root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on iommu=pt\n' > /etc/kernel/cmdline",
        "proxmox-boot-tool refresh",
    ]
    assert noops == []


def test_noop_systemd_boot_already_has_the_tokens() -> None:
    done = written_files(
        kernel_cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on iommu=pt\n",
        backup_present=True,
        owned_tokens=TOKENS,
    )
    commands, noops = cmdline(SYSTEMD_BOOT, done)
    assert commands == []
    assert noops == ["/etc/kernel/cmdline already has amd_iommu=on iommu=pt"]


def test_update_systemd_boot_removes_only_its_own_token_and_keeps_the_backup() -> None:
    before = written_files(
        kernel_cmdline="root=ZFS=rpool/ROOT/pve-1 mitigations=off amd_iommu=on iommu=pt pcie_aspm=off\n",
        backup_present=True,
        owned_tokens=(*TOKENS, "pcie_aspm=off"),
    )
    commands, _ = cmdline(SYSTEMD_BOOT, before)
    assert commands == [
        "mkdir -p /etc/pvegpu",
        "printf %s 'amd_iommu=on\niommu=pt\n' > /etc/pvegpu/cmdline-tokens",
        "printf %s 'root=ZFS=rpool/ROOT/pve-1 mitigations=off amd_iommu=on iommu=pt\n' > /etc/kernel/cmdline",
        "proxmox-boot-tool refresh",
    ]


def test_update_systemd_boot_users_own_token_is_not_taken_over() -> None:
    users = written_files(kernel_cmdline="root=ZFS=rpool/ROOT/pve-1 iommu=pt\n", backup_present=True)
    commands, _ = cmdline(SYSTEMD_BOOT, users)
    assert commands == [
        "mkdir -p /etc/pvegpu",
        "printf %s 'amd_iommu=on\n' > /etc/pvegpu/cmdline-tokens",
        "printf %s 'root=ZFS=rpool/ROOT/pve-1 iommu=pt amd_iommu=on\n' > /etc/kernel/cmdline",
        "proxmox-boot-tool refresh",
    ]


@pytest.mark.parametrize(
    ("boot", "boot_files", "message"),
    [
        (
            UNKNOWN,
            written_files(),
            "pve1: bootloader unknown, so no kernel command line is written: "
            "/etc/default/grub absent; update-grub not found",
        ),
        (
            SYSTEMD_BOOT,
            written_files(),
            "pve1: systemd-boot without /etc/kernel/cmdline: no command line to add amd_iommu=on iommu=pt to",
        ),
    ],
)
def test_error_cmdline_refuses_what_it_cannot_apply(
    boot: BootLoaderInfo, boot_files: BootFiles, message: str
) -> None:
    with pytest.raises(OperationError) as raised:
        cmdline(boot, boot_files)
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
        f"printf %s '{MODULES_6_8}' > /etc/modules-load.d/pvegpu-vfio.conf",
        f"printf %s '{MODPROBE_IDS}' > /etc/modprobe.d/pvegpu-vfio.conf",
        "update-initramfs -u -k all",
    ]
    assert noops == []


def test_noop_vfio_dropins_match() -> None:
    commands, noops = vfio(written_files(modules_load=MODULES_6_8, modprobe=MODPROBE_IDS))
    assert commands == []
    assert noops == [
        "/etc/modules-load.d/pvegpu-vfio.conf and /etc/modprobe.d/pvegpu-vfio.conf already bind "
        "ids 10de:22e8,10de:2bb1 to vfio-pci"
    ]


def test_update_only_the_changed_dropin_then_update_initramfs() -> None:
    commands, _ = vfio(written_files(modules_load=MODULES_6_8, modprobe=MODPROBE_IDS), functions=ALL[:2])
    assert len(commands) == 2
    assert str(commands[0]).startswith("printf %s '# Managed by pvegpu")
    assert str(commands[0]).endswith("' > /etc/modprobe.d/pvegpu-vfio.conf")
    assert commands[1] == "update-initramfs -u -k all"


# --- reboot_if_pending -------------------------------------------------------------------------

RUNNING_OLD = ("BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve", "root=/dev/mapper/pve-root", "ro", "quiet")
RUNNING_NEW = (*RUNNING_OLD, *TOKENS)


def reboot(running: tuple[str, ...], hw: HostHardware, allow: bool, functions: tuple[str, ...] = ALL) -> Any:
    return run_op(
        reboot_if_pending,
        {KernelCmdline: running},
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
        self.stale = stale
        self.new_hw = new_hw

    def disconnect(self) -> None:
        self.connected = False

    def connect(self, **_kwargs: Any) -> None:
        self.connected = True

    def get_fact(self, fact: type, **_kwargs: Any) -> object:
        fresh = self.reads >= 2 * self.stale  # two facts per poll
        self.reads += 1
        if fact is KernelCmdline:
            return RUNNING_NEW if fresh else RUNNING_OLD
        return self.new_hw if fresh else two_cards()


def wait_function(timeout_s: float) -> Any:
    commands, _ = run_op(
        reboot_if_pending,
        {KernelCmdline: RUNNING_OLD},
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
    wait_function(60)(None, target)
    assert target.reads == 6


def test_error_still_pending_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pvegpu.operations.reboot.time.sleep", lambda _s: None)
    target = Rebooting(stale=0, new_hw=two_cards(driver="nvidia"))
    with pytest.raises(OperationError) as raised:
        wait_function(0.05)(None, target)
    assert str(raised.value) == (
        "after reboot, 0 s: reboot required: 0000:41:00.0, 0000:51:00.0 still bound to nvidia; "
        "0000:41:00.1, 0000:51:00.1 still bound to snd_hda_intel"
    )
