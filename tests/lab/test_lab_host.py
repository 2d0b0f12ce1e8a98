"""The host role against lab nodes with a GRUB and a systemd-boot layout (lab/boot.py): converge, reboot once
when allowed and verify, then no change; pending message when not allowed; user tokens kept; bad ids refused
before any change."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab import boot, hosts
from lab.pve import node as pve_node

pytestmark = pytest.mark.lab

INVENTORY = "tests/lab/inventories/host_role.py"
DEPLOY = "deploy/host.py"
OPS = ("cmdline", "vfio", "reboot")

MakeHost = Callable[..., hosts.LabHost]
PyinfraCli = Callable[..., subprocess.CompletedProcess[str]]


def tokens() -> tuple[str, ...]:
    """pvegpu's tokens for the CPU of this machine (the lab nodes share its /proc/cpuinfo)."""
    vendor = "amd" if "AuthenticAMD" in Path("/proc/cpuinfo").read_text() else "intel"
    return (f"{vendor}_iommu=on", "iommu=pt")


class Run:
    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        self.rc = result.returncode
        self.stderr = result.stderr
        results = json.loads(result.stdout)["results"] if result.stdout.strip() else {"operations": []}
        self.outcome = {}
        for name, op in zip(OPS, results["operations"], strict=False):
            self.outcome[name] = next(kind for kind in ("success", "error", "no_change") if op[kind])


def deploy(
    cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch, node: hosts.LabHost, extra: dict[str, Any]
) -> Run:
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps(extra))
    return Run(cli("--json", "-y", "--limit", node.name, INVENTORY, DEPLOY, check=False))


def read(node: hosts.LabHost, path: str) -> str:
    return (node.root / path.lstrip("/")).read_text()


def reboots(node: hosts.LabHost) -> int:
    log = node.root / "var/log/pvegpu-lab/reboot.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize(
    ("layout", "mode"), [("grub", "netns"), ("systemd-boot", "nspawn")], ids=["grub", "systemd-boot"]
)
def test_create_reboots_once_verifies_then_noop(
    make_host: MakeHost,
    pyinfra_cli: PyinfraCli,
    monkeypatch: pytest.MonkeyPatch,
    layout: boot.Layout,
    mode: str,
) -> None:
    node = make_host("reference", mode)
    boot.install(node, layout)
    allowed = {"pve_host": {"allow_reboot": True}}

    first = deploy(pyinfra_cli, monkeypatch, node, allowed)

    assert (first.rc, first.outcome) == (0, {"cmdline": "success", "vfio": "success", "reboot": "success"}), (
        first.stderr
    )
    assert reboots(node) == 1
    running = boot.running_cmdline_file(node).read_text().split()
    assert running[-3:] == [*tokens(), "quiet"] if layout == "grub" else running[-2:] == list(tokens())
    assert set(node.gpu_drivers().values()) == {"vfio-pci"}
    modprobe = read(node, "/etc/modprobe.d/pvegpu-vfio.conf")
    assert "options vfio-pci ids=10de:22e8,10de:2bb1\n" in modprobe
    if layout == "systemd-boot":
        assert read(node, "/var/log/pvegpu-lab/proxmox-boot-tool.log").splitlines() == [
            "proxmox-boot-tool status",
            "proxmox-boot-tool refresh",
        ]

    second = deploy(pyinfra_cli, monkeypatch, node, allowed)

    assert (second.rc, second.outcome) == (
        0,
        {"cmdline": "no_change", "vfio": "no_change", "reboot": "no_change"},
    )
    assert reboots(node) == 1


def test_noop_pending_without_allow_reboot_says_what_is_pending(
    make_host: MakeHost, pyinfra_cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_host("reference", "netns")
    boot.install(node, "grub")

    first = deploy(pyinfra_cli, monkeypatch, node, {})

    assert (first.rc, first.outcome) == (
        0,
        {"cmdline": "success", "vfio": "success", "reboot": "no_change"},
    ), first.stderr
    gpus = sorted(gpu["address"] for gpu in node.manifest()["gpus"])
    expected = (
        f"[{node.name}] reboot required: /proc/cmdline lacks {' '.join(tokens())}; "
        f"{', '.join(f'{gpu}.0' for gpu in gpus)} still bound to nvidia; "
        f"{', '.join(f'{gpu}.1' for gpu in gpus)} still bound to snd_hda_intel "
        "(pve_host.allow_reboot is false: not rebooting)\n"
    )
    assert expected in first.stderr
    assert reboots(node) == 0

    second = deploy(pyinfra_cli, monkeypatch, node, {})

    assert (second.rc, second.outcome) == (
        0,
        {"cmdline": "no_change", "vfio": "no_change", "reboot": "no_change"},
    )
    assert expected in second.stderr
    assert reboots(node) == 0


def test_update_keeps_users_token_removes_dropped_one_backs_up_once(
    make_host: MakeHost, pyinfra_cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_host("reference", "netns")
    boot.install(node, "systemd-boot")
    original = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet mitigations=off\n"
    (node.root / "etc/kernel/cmdline").write_text(original)
    with_extra = {"pve_host": {"allow_reboot": True, "extra_cmdline": ["pcie_aspm=off"]}}

    first = deploy(pyinfra_cli, monkeypatch, node, with_extra)

    assert first.rc == 0, first.stderr
    assert (
        read(node, "/etc/kernel/cmdline") == original.rstrip("\n") + f" {' '.join(tokens())} pcie_aspm=off\n"
    )
    assert read(node, "/etc/kernel/cmdline.pvegpu-orig") == original

    second = deploy(pyinfra_cli, monkeypatch, node, {"pve_host": {"allow_reboot": True}})

    assert (second.rc, second.outcome["cmdline"]) == (0, "success"), second.stderr
    assert read(node, "/etc/kernel/cmdline") == original.rstrip("\n") + f" {' '.join(tokens())}\n"
    assert read(node, "/etc/kernel/cmdline.pvegpu-orig") == original
    assert read(node, "/etc/pvegpu/cmdline-tokens").split() == list(tokens())
    running = boot.running_cmdline_file(node).read_text().split()
    assert "mitigations=off" in running
    assert "pcie_aspm=off" not in running
    assert reboots(node) == 2


def test_error_ids_matching_no_function_fail_before_any_change(
    make_host: MakeHost, pyinfra_cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_host("reference", "netns")
    boot.install(node, "grub")

    run = deploy(pyinfra_cli, monkeypatch, node, {"node": {"gpus": {"ids": ["10de:ffff"]}}})

    assert run.rc == 1
    assert f"{node.name}: node.gpus.ids: 10de:ffff matches no display function on this host" in run.stderr
    assert not (node.root / "etc/default/grub.d/pvegpu.cfg").exists()
    assert not (node.root / "etc/modprobe.d/pvegpu-vfio.conf").exists()


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"node": {"profile": "vms"}}, "node.profile: must be one of vm, lxc, baremetal (got 'vms')"),
        (
            {"pve_host": {"extra_cmdline": ["a b"]}},
            "pve_host.extra_cmdline.0: 'a b' is not a kernel parameter like name or name=value",
        ),
    ],
)
def test_error_bad_inventory_stops_before_connecting(
    make_host: MakeHost,
    pyinfra_cli: PyinfraCli,
    monkeypatch: pytest.MonkeyPatch,
    extra: dict[str, Any],
    problem: str,
) -> None:
    node = make_host("reference", "netns")

    run = deploy(pyinfra_cli, monkeypatch, node, extra)

    assert run.rc == 2
    assert f"{node.name}: {problem}" in run.stderr
    assert "Connecting to hosts" not in run.stderr


def test_create_lxc_profile_wants_iommu_pt_port_pm_off_and_no_vfio(
    make_host: MakeHost, pyinfra_cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_host("reference", "netns")
    boot.install(node, "grub")

    run = deploy(pyinfra_cli, monkeypatch, node, {"node": {"profile": "lxc"}})

    assert (run.rc, run.outcome) == (0, {"cmdline": "success", "vfio": "no_change", "reboot": "no_change"}), (
        run.stderr
    )
    assert read(node, "/etc/default/grub.d/pvegpu.cfg").endswith(
        'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt pcie_port_pm=off"\n'
    )
    assert not (node.root / "etc/modprobe.d/pvegpu-vfio.conf").exists()
    assert (
        f"[{node.name}] reboot required: /proc/cmdline lacks iommu=pt pcie_port_pm=off "
        "(pve_host.allow_reboot is false: not rebooting)\n"
    ) in run.stderr
    assert set(node.gpu_drivers().values()) == {"nvidia", "snd_hda_intel"}


def test_doctor_reports_host_checks_and_writes_json(
    make_host: MakeHost, pyinfra_cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = make_host("reference", "netns")
    monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(tmp_path))

    result = pyinfra_cli("-y", "--limit", node.name, "inventory/lab.py", "deploy/doctor.py")

    report = json.loads((tmp_path / f"{node.name}.json").read_text())
    checks = {row["check"]: (row["state"], row["detail"]) for row in report["checks"]}
    groups = len(node.manifest()["groups"])
    assert checks["IOMMU"] == ("ok", f"on: {groups} IOMMU groups")
    # The lab's fake config files hold the 64 bytes an unprivileged read returns: ACS cannot be read.
    assert checks["gpu0 ACS at 0000:40:01.1"] == (
        "unknown",
        "config space read returned 64 bytes (extended capabilities need root and 4096)",
    )
    assert checks["gpu0 BAR1"][0] == "ok"
    assert checks["gpu0 BAR1"][1].endswith(", above 4 GiB")
    assert [name for name, (state, _) in checks.items() if state == "bios"] == [
        "DF C-states",
        "APBDIS",
        "SOC P-state",
    ]
    assert (
        f"[{node.name}] host checks of node {node.name} (also in {tmp_path / node.name}.json):"
        in result.stderr
    )
    assert "GPU topology of node" in result.stderr


def test_doctor_reports_mapping_health_after_bios_changes(
    pyinfra_cli: PyinfraCli,
    lab_ssh: Callable[[hosts.LabHost, str], str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Mappings of the reference box, then the node's hardware changes under them: the doctor says valid,
    renumber-only drift, hardware changed, per GPU, and writes nothing."""
    name = f"d{os.getpid() % 10000}"
    node = pve_node.up(name, "reference")
    try:
        monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(tmp_path))
        for n, gpu in enumerate(node.manifest()["gpus"]):
            line = f"id=10de:2bb1,node={name},path={gpu['address']},iommugroup={gpu['iommu_group']}"
            # pvegpu's mark, as it creates them (the owner: the node's name, no cluster): the doctor, like the
            # pre-start hook, judges a repair only of mappings that carry it
            lab_ssh(
                node,
                f"pvesh create /cluster/mapping/pci --id gpu{n} --map {line},subsystem-id=10de:204b "
                f"--description 'pvegpu-owner: {name}'",
            )
        cfg = node.root / "etc/pve/mapping/pci.cfg"
        written = cfg.read_text()
        subject = f"[{name}] PCI mappings of VM 100 ({name}v100) on node {name}"
        rebuild = "`pyinfra inventory.py deploy/rebuild_vm.py`"

        def doctor() -> str:
            return pyinfra_cli("-y", "--limit", name, "inventory/lab.py", "deploy/doctor.py").stderr

        valid = doctor()
        hosts.retopo(name, "reference-renumbered")
        drift = doctor()
        hosts.retopo(name, "reference-other-card")
        changed = doctor()

        assert f"{subject}: valid\n  gpu0 {name}: valid\n" in valid
        assert (
            f"{subject}: renumber-only drift (only bus and group numbers changed: {rebuild} repairs them)\n"
            f"  gpu0 {name}: 0000:41:00 group 14 -> 0000:21:00 group 16 (renumbered)\n"
        ) in drift
        assert f"{subject}: hardware changed (check the hardware, then run {rebuild})\n" in changed
        assert (
            f"  gpu5 {name}: slot 6 held 10de:2bb1 subsystem 10de:204b at 0000:d1:00, now 10de:26b1 "
            "subsystem 10de:16a1 at 0000:d1:00: another model\n"
        ) in changed
        assert cfg.read_text() == written
    finally:
        hosts.down(name)


# What a run leaves on a node's boot path: the files pvegpu writes and what their consumers generated.
BOOT_PATHS = (
    "/etc/default/grub.d/pvegpu.cfg",
    "/boot/grub/grub.cfg",
    "/etc/kernel/cmdline",
    "/etc/kernel/cmdline.pvegpu-orig",
    "/etc/pvegpu/cmdline-tokens",
    f"/var/lib/pvegpu-lab/esp/{boot.ESP_UUID}/loader/entries/proxmox-{boot.KERNEL}.conf",
    "/etc/modules-load.d/pvegpu-vfio.conf",
    "/etc/modprobe.d/pvegpu-vfio.conf",
    f"/boot/initrd.img-{boot.KERNEL}",
)


def boot_state(node: hosts.LabHost) -> dict[str, object]:
    files = {path: read(node, path) for path in BOOT_PATHS if (node.root / path.lstrip("/")).is_file()}
    running = boot.running_cmdline_file(node).read_text()
    return {"files": files, "running": running, "drivers": node.gpu_drivers()}


@pytest.mark.parametrize(
    ("layout", "mode"), [("grub", "netns"), ("systemd-boot", "nspawn")], ids=["grub", "systemd-boot"]
)
def test_drift_interrupted_run_converges_to_a_clean_runs_state_with_one_reboot(
    make_host: MakeHost,
    pyinfra_cli: PyinfraCli,
    monkeypatch: pytest.MonkeyPatch,
    layout: boot.Layout,
    mode: str,
) -> None:
    allowed = {"pve_host": {"allow_reboot": True}}
    clean = make_host("reference", mode)
    boot.install(clean, layout)
    assert deploy(pyinfra_cli, monkeypatch, clean, allowed).rc == 0
    node = make_host("reference", mode)
    boot.install(node, layout)
    # The cut: pvegpu's files are written, nothing that consumes them ran (no update-grub, no
    # proxmox-boot-tool refresh, no update-initramfs); on systemd-boot the command line was cut to nothing.
    for path in ("/etc/modules-load.d/pvegpu-vfio.conf", "/etc/modprobe.d/pvegpu-vfio.conf"):
        (node.root / path.lstrip("/")).write_text(read(clean, path))
    if layout == "grub":
        (node.root / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
        (node.root / "etc/default/grub.d/pvegpu.cfg").write_text(
            read(clean, "/etc/default/grub.d/pvegpu.cfg")
        )
    else:
        (node.root / "etc/kernel/cmdline").write_text("")

    first = deploy(pyinfra_cli, monkeypatch, node, allowed)

    assert first.rc == 0, first.stderr
    if layout == "systemd-boot":
        assert (
            f"[{node.name}] /etc/kernel/cmdline is empty: restoring it from the running kernel's "
            f"command line: '{boot.SYSTEMD_BOOT_CMDLINE}'"
        ) in first.stderr
    assert reboots(node) == 1
    assert boot_state(node) == boot_state(clean)

    second = deploy(pyinfra_cli, monkeypatch, node, allowed)

    assert (second.rc, second.outcome) == (
        0,
        {"cmdline": "no_change", "vfio": "no_change", "reboot": "no_change"},
    ), second.stderr
    assert reboots(node) == 1
