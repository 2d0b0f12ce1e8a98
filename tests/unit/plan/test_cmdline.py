"""plan.cmdline: desired tokens per profile and CPU vendor; edits that remove only pvegpu's own tokens."""

from __future__ import annotations

import pytest

from pvegpu.plan.cmdline import (
    CmdlineEdit,
    booted_base,
    cmdline_damage,
    desired_tokens,
    edit_cmdline,
    unsafe_cmdline,
)
from pvegpu.plan.errors import PlanError

# Synthesized: a fresh Proxmox VE 8 systemd-boot (ZFS) /etc/kernel/cmdline, as the installer writes it.
FRESH = ("root=ZFS=rpool/ROOT/pve-1", "boot=zfs", "quiet")


@pytest.mark.parametrize(
    ("vendor", "extra", "expected"),
    [
        ("amd", (), ("amd_iommu=on", "iommu=pt")),
        ("intel", (), ("intel_iommu=on", "iommu=pt")),
        ("amd", ("pcie_aspm=off", "iommu=pt"), ("amd_iommu=on", "iommu=pt", "pcie_aspm=off")),
    ],
)
def test_desired_tokens_vm(vendor: str, extra: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert desired_tokens("vm", vendor, extra) == expected


@pytest.mark.parametrize("profile", ["lxc", "baremetal"])
@pytest.mark.parametrize("vendor", ["amd", "intel", None])
def test_desired_tokens_host_driver_profiles_pt_and_port_pm_off(profile: str, vendor: str | None) -> None:
    assert desired_tokens(profile, vendor, ("pcie_aspm=off", "iommu=pt", "pcie_port_pm=off")) == (
        "iommu=pt",
        "pcie_port_pm=off",
        "pcie_aspm=off",
    )


@pytest.mark.parametrize(
    ("profile", "vendor", "message"),
    [
        (
            "vm",
            None,
            "host: cannot tell the CPU vendor (None in /proc/cpuinfo), so not which <vendor>_iommu=on to set",
        ),
        ("vms", "amd", "node.profile: 'vms' is not one of vm, lxc, baremetal"),
    ],
)
def test_desired_tokens_refused(profile: str, vendor: str | None, message: str) -> None:
    with pytest.raises(PlanError) as raised:
        desired_tokens(profile, vendor, ())
    assert str(raised.value) == message


def test_create_appends_missing_tokens_and_owns_them() -> None:
    assert edit_cmdline(FRESH, (), ("amd_iommu=on", "iommu=pt")) == CmdlineEdit(
        tokens=(*FRESH, "amd_iommu=on", "iommu=pt"),
        owned=("amd_iommu=on", "iommu=pt"),
        added=("amd_iommu=on", "iommu=pt"),
        removed=(),
    )


def test_noop_when_everything_is_there() -> None:
    current = (*FRESH, "amd_iommu=on", "iommu=pt")
    owned = ("amd_iommu=on", "iommu=pt")
    assert edit_cmdline(current, owned, owned) == CmdlineEdit(
        tokens=current, owned=owned, added=(), removed=()
    )


def test_a_users_token_survives_and_stays_the_users() -> None:
    # The user had iommu=pt before pvegpu: pvegpu does not own it, so dropping it later leaves it.
    current = (*FRESH, "iommu=pt", "mitigations=off")
    first = edit_cmdline(current, (), ("amd_iommu=on", "iommu=pt"))
    assert first == CmdlineEdit(
        tokens=(*current, "amd_iommu=on"), owned=("amd_iommu=on",), added=("amd_iommu=on",), removed=()
    )
    later = edit_cmdline(first.tokens, first.owned, ())
    assert later.tokens == current
    assert later.removed == ("amd_iommu=on",)


def test_update_removes_a_token_pvegpu_owned_and_no_longer_wants() -> None:
    current = (*FRESH, "amd_iommu=on", "iommu=pt", "pcie_aspm=off")
    owned = ("amd_iommu=on", "iommu=pt", "pcie_aspm=off")
    assert edit_cmdline(current, owned, ("amd_iommu=on", "iommu=pt")) == CmdlineEdit(
        tokens=(*FRESH, "amd_iommu=on", "iommu=pt"),
        owned=("amd_iommu=on", "iommu=pt"),
        added=(),
        removed=("pcie_aspm=off",),
    )


def test_owned_token_a_user_deleted_is_added_again() -> None:
    assert edit_cmdline(FRESH, ("iommu=pt",), ("iommu=pt",)) == CmdlineEdit(
        tokens=(*FRESH, "iommu=pt"), owned=("iommu=pt",), added=("iommu=pt",), removed=()
    )


def test_switch_to_baremetal_and_back_gives_the_fresh_line() -> None:
    # vm -> baremetal drops amd_iommu=on (pvegpu's), keeps iommu=pt, adds pcie_port_pm=off; back to vm drops
    # it and gives a fresh deploy's line.
    fresh = edit_cmdline(FRESH, (), desired_tokens("vm", "amd", ()))
    baremetal = edit_cmdline(fresh.tokens, fresh.owned, desired_tokens("baremetal", "amd", ()))
    assert baremetal == CmdlineEdit(
        tokens=(*FRESH, "iommu=pt", "pcie_port_pm=off"),
        owned=("iommu=pt", "pcie_port_pm=off"),
        added=("pcie_port_pm=off",),
        removed=("amd_iommu=on",),
    )
    back = edit_cmdline(baremetal.tokens, baremetal.owned, desired_tokens("vm", "amd", ()))
    assert back == CmdlineEdit(
        tokens=fresh.tokens, owned=fresh.owned, added=("amd_iommu=on",), removed=("pcie_port_pm=off",)
    )


RUNNING = (r"initrd=\EFI\proxmox\6.8.12-4-pve\initrd.img-6.8.12-4-pve", *FRESH, "amd_iommu=on", "iommu=pt")


def test_booted_base_drops_loader_and_pvegpu_tokens() -> None:
    assert booted_base(RUNNING, ("amd_iommu=on", "iommu=pt")) == FRESH


@pytest.mark.parametrize(
    ("text", "damage"),
    [
        (" \n", "empty"),
        ('root=ZFS=rpool/ROOT/pve-1 a="b\n', "cut off (an unclosed quote)"),
        ("boot=zfs quiet\n", "without root="),
        ("root=ZFS=rpool/ROOT/pve-1 boot=z", "cut off (a prefix of the running command line)"),
        ("root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on\n", None),
        ("root=ZFS=rpool/ROOT/pve-1 quiet\n", None),  # shorter, but not a cut: unsafe_cmdline refuses it
    ],
)
def test_cmdline_damage(text: str, damage: str | None) -> None:
    assert cmdline_damage(text, FRESH) == damage


def test_unsafe_cmdline() -> None:
    own = ("amd_iommu=on", "iommu=pt")
    assert unsafe_cmdline((*FRESH, *own), FRESH, own) is None
    assert unsafe_cmdline(("boot=zfs", *own), ("boot=zfs",), own) == "it has no root="
    assert (
        unsafe_cmdline(("root=x", "y" * 2045), ("root=x",), own) == "it is 2052 bytes, the kernel keeps 2047"
    )
