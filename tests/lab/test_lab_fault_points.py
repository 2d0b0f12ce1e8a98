"""Fault points of a first `deploy/host.py` run (reboot allowed) on fresh lab nodes, GRUB (netns) and
systemd-boot (nspawn): the connection cut, a writer or tool killed, the disk full, at a named point
(lab/faults.py injects them for real: root's login shell on the node). Each row: the faulted run fails with a
line naming the path or the command, no traceback, nothing half-written in place; the fault removed, runs
until exit 0, their number asserted; the node's boot state (files, grub.cfg / ESP entry, initramfs, running
command line, drivers) is then exactly a clean run's, with one reboot in all, and one more run changes
nothing.

Issue 12's fault points, and where each is proven ("row": a row of ROWS here):

 1 GRUB: cut after the drop-in is written, before update-grub: row grub-cut-before-update-grub
 2 GRUB: update-grub killed mid-way (grub.cfg.new staged): row grub-update-grub-killed
 3 GRUB: disk full while the drop-in is written: row grub-dropin-disk-full
 4 vfio drop-ins written, cut before update-initramfs: row grub-cut-before-initramfs
 5 update-initramfs killed mid-way (the image staged): row grub-initramfs-killed
 6 systemd-boot: cut after /etc/kernel/cmdline is written, before the refresh: row sdb-cut-before-refresh
 7 systemd-boot: the refresh dies mid-way (ESP full: its entry half written): row sdb-refresh-disk-full
 8 systemd-boot: disk full while /etc/kernel/cmdline is written: row sdb-cmdline-disk-full
 9 systemd-boot: the /etc/kernel/cmdline writer killed after staging: row sdb-cmdline-writer-killed
10 systemd-boot: /etc/kernel/cmdline cut inside a quote by an in-place writer, restored from the running
   command line with a warning: row sdb-cmdline-truncated
11 pvegpu's files written, nothing consumed (no refresh, no initramfs, no reboot), /etc/kernel/cmdline
   emptied, both layouts: tests/lab/test_lab_host.py::test_drift_interrupted_run_converges_to_a_clean_...
12 an HTML page (exit 0) from GET /cluster/mapping/pci, then 13 the VM create task killed (`lock: create`,
   a half-made config): tests/lab/test_lab_faults.py::test_drift_garbage_and_a_killed_create_then_...
14 the image download cut (its temporary file left), then 15 the cloud-init user-data snippet writer
   killed after staging: tests/lab/test_lab_faults.py::test_cut_download_then_cut_snippet_write_...
16 garbage, truncated JSON, exit 0 from every API endpoint (GET, PUT, POST): one line naming the
   endpoint, never a success: tests/unit/pve/test_answers_garbage.py
17 a cut during the mapping sync or the VM create after Proxmox wrote: created with a warning, never "not
   created": tests/unit/operations/test_mapping.py::test_drift_create_cut_after_proxmox_wrote_is_created_...,
   tests/unit/operations/test_vm.py::test_drift_create_cut_after_the_task_ran_is_created_with_a_warning
18 another node's map line on a mapping, kept unless that node is in the inventory's cluster:
   tests/unit/operations/test_mapping.py::test_noop_another_admins_line_of_a_node_outside_the_cluster_is_kept
19 the reboot drops every SSH session (pyinfra's, the API's) and the first run still finishes:
   tests/lab/test_demo.py (two connections closed, run 1 passes), tests/unit/pve/test_ssh_reconnect.py

Issue 24's point 8: every run whose connection is cut ends with one line for the node naming the step
(pvegpu/run/progress.py `cut_line`), no traceback (no gevent greenlet's, no paramiko handshake's): the cut
rows here; the node's link down for 20 s in the reboot wait (row grub-link-down-in-reboot-wait: the wait
outlasts it, the run passes); the link down in the mapping sync, a frozen then killed API session in it,
and pyinfra's connection cut before an operation that reads a fact:
tests/lab/test_lab_faults.py::test_link_down_frozen_api_and_cut_before_a_fact_read_each_one_line.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, cast

import pytest

from lab import boot, faults, hosts
from pvegpu.run.progress import cut_line
from tests.lab.test_lab_host import boot_state, deploy, read, reboots

pytestmark = pytest.mark.lab

MakeHost = Callable[..., hosts.LabHost]
PyinfraCli = Callable[..., subprocess.CompletedProcess[str]]

# A run that does not converge fails its reboot's verification in 30 s (the least allowed), not 600.
ALLOWED = {"pve_host": {"allow_reboot": True, "reboot_timeout_s": 30}}
MODE: dict[boot.Layout, hosts.Mode] = {"grub": "netns", "systemd-boot": "nspawn"}
CMDLINE_OP = "Set the kernel command line tokens pvegpu owns"
VFIO_OP = "Bind GPU functions to vfio-pci at boot"
REBOOT_OP = "Reboot if the running kernel lacks the boot state, and verify"
STEP = "Prepare the Proxmox host | {}"
# The commands pyinfra sends (whole, as root's login shell gets them), and the atomic writes' staged files.
UPDATE_GRUB = "sh -c 'update-grub || *"
REFRESH = "sh -c 'proxmox-boot-tool refresh || *"
UPDATE_INITRAMFS = "sh -c 'update-initramfs -u -k all || *"
REBOOT = "sh -c '( sleep 1 && reboot )*"
GRUB_DROPIN = "/etc/default/grub.d/pvegpu.cfg"
GRUB_DROPIN_STAGED = "/etc/default/grub.d/.pvegpu.cfg.pvegpu-new"
GRUB_CFG = "/boot/grub/grub.cfg"
CMDLINE = "/etc/kernel/cmdline"
CMDLINE_STAGED = "/etc/kernel/.cmdline.pvegpu-new"
MODPROBE = "/etc/modprobe.d/pvegpu-vfio.conf"
ESP_ENTRY = f"/var/lib/pvegpu-lab/esp/{boot.ESP_UUID}/loader/entries/proxmox-{boot.KERNEL}.conf"
INITRD = f"/boot/initrd.img-{boot.KERNEL}"
# An in-place writer's new line, cut by a full disk inside a quoted value.
TRUNCATED = f'{boot.SYSTEMD_BOOT_CMDLINE} dyndbg="file drivers/vfio'
AGAIN = "the next run checks {} and runs it again"


@dataclass(frozen=True)
class As:
    """A file's expected content: what `run` left at `path` (`clean`: the clean run, `before`: the node
    before the faulted run), its first `length` characters."""

    run: Literal["clean", "before"]
    path: str
    length: int | None = None


@dataclass(frozen=True)
class Row:
    """One fault point: the fault (None: the node starts damaged, `damage` says how) and the command it
    fires at; what the faulted run prints (`printed` under operation `op`, one `[node] ` line each), and
    what it leaves (`left`: path -> content, None: absent); `extra`: inventory data on top of ALLOWED, with
    which the faulted run passes (the fault outlasted)."""

    layout: boot.Layout
    fault: faults.Fault | None
    pattern: str = ""
    arg: str = ""
    op: str | None = CMDLINE_OP
    printed: tuple[str, ...] = ()
    left: dict[str, str | As | None] = field(default_factory=dict)
    damage: dict[str, str] = field(default_factory=dict)
    extra: dict[str, object] | None = None


def executed(count: int) -> str:
    return f"Error: executed {count} commands"


def cut(count: int, op: str = CMDLINE_OP) -> tuple[str, str]:
    """What a cut under `op` after `count` commands prints: pyinfra's line, then pvegpu's (the last)."""
    return executed(count), cut_line(STEP.format(op))


ROWS = {
    "grub-cut-before-update-grub": Row(
        "grub",
        "cut",
        UPDATE_GRUB,
        printed=cut(1),
        left={GRUB_DROPIN: As("clean", GRUB_DROPIN), GRUB_CFG: As("before", GRUB_CFG)},
    ),
    "grub-update-grub-killed": Row(
        "grub",
        "kill-at-rename",
        UPDATE_GRUB,
        f"{GRUB_CFG}.new",
        printed=(
            "Killed",
            f"pvegpu: update-grub failed (exit 137); {AGAIN.format(GRUB_CFG)}",
            executed(1),
        ),
        left={f"{GRUB_CFG}.new": As("clean", GRUB_CFG), GRUB_CFG: As("before", GRUB_CFG)},
    ),
    "grub-dropin-disk-full": Row(
        "grub",
        "disk-full",
        f"*{GRUB_DROPIN_STAGED}*",
        "16",
        printed=(
            "sh: 1: printf: printf: I/O error",
            f"pvegpu: could not write {GRUB_DROPIN} (left unchanged)",
            executed(0),
        ),
        left={GRUB_DROPIN: None, GRUB_DROPIN_STAGED: None},
    ),
    "grub-cut-before-initramfs": Row(
        "grub",
        "cut",
        UPDATE_INITRAMFS,
        op=VFIO_OP,
        printed=cut(2, VFIO_OP),
        left={MODPROBE: As("clean", MODPROBE), INITRD: As("before", INITRD)},
    ),
    "grub-initramfs-killed": Row(
        "grub",
        "kill-at-rename",
        UPDATE_INITRAMFS,
        f"{INITRD}.new",
        op=VFIO_OP,
        printed=(
            "Killed",
            f"pvegpu: update-initramfs -u -k all failed (exit 137); {AGAIN.format('/boot/initrd.img-*')}",
            executed(2),
        ),
        left={f"{INITRD}.new": As("clean", INITRD), INITRD: As("before", INITRD)},
    ),
    "sdb-cut-before-refresh": Row(
        "systemd-boot",
        "cut",
        REFRESH,
        printed=cut(4),
        left={CMDLINE: As("clean", CMDLINE), ESP_ENTRY: As("before", ESP_ENTRY)},
    ),
    "sdb-refresh-disk-full": Row(
        "systemd-boot",
        "disk-full",
        REFRESH,
        "100",
        printed=(
            "/usr/local/sbin/proxmox-boot-tool: 26: printf: printf: I/O error",
            "pvegpu: proxmox-boot-tool refresh failed (exit 1); " + AGAIN.format("the ESPs' loader entries"),
            executed(4),
        ),
        left={CMDLINE: As("clean", CMDLINE), ESP_ENTRY: As("clean", ESP_ENTRY, 100)},
    ),
    "sdb-cmdline-disk-full": Row(
        "systemd-boot",
        "disk-full",
        f"*{CMDLINE_STAGED}*",
        "16",
        printed=(
            "sh: 1: printf: printf: I/O error",
            f"pvegpu: could not write {CMDLINE} (left unchanged)",
            executed(3),
        ),
        left={CMDLINE: As("before", CMDLINE), CMDLINE_STAGED: None},
    ),
    "sdb-cmdline-writer-killed": Row(
        "systemd-boot",
        "kill-at-rename",
        f"*{CMDLINE_STAGED}*",
        CMDLINE_STAGED,
        printed=("Killed", executed(3)),
        left={CMDLINE: As("before", CMDLINE), CMDLINE_STAGED: As("clean", CMDLINE)},
    ),
    "grub-link-down-in-reboot-wait": Row(
        "grub",
        "link-down",
        REBOOT,
        "20",
        op=None,
        extra={"pve_host": {"allow_reboot": True, "reboot_timeout_s": 120}},
    ),
    "sdb-cmdline-truncated": Row(
        "systemd-boot",
        None,
        op=None,
        printed=(
            f"{CMDLINE} is cut off (an unclosed quote): restoring it from the running kernel's "
            f"command line: '{boot.SYSTEMD_BOOT_CMDLINE}'",
        ),
        damage={CMDLINE: TRUNCATED},
    ),
}


@pytest.fixture(scope="module")
def clean_states() -> dict[str, dict[str, object]]:
    """Layout -> the boot state a clean first run leaves (filled by the first row of each layout)."""
    return {}


def clean_state(
    layout: boot.Layout,
    states: dict[str, dict[str, object]],
    make_host: MakeHost,
    cli: PyinfraCli,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, object]:
    if layout not in states:
        clean = make_host("reference", MODE[layout])
        boot.install(clean, layout)
        run = deploy(cli, monkeypatch, clean, ALLOWED)
        assert (run.rc, reboots(clean)) == (0, 1), run.stderr
        states[layout] = boot_state(clean)
        hosts.down(clean.name)
    return states[layout]


def file_or_none(node: hosts.LabHost, path: str) -> str | None:
    target = node.root / path.lstrip("/")
    return target.read_text() if target.exists() else None


def expected_output(node: hosts.LabHost, row: Row) -> str:
    lines = "".join(f"[{node.name}] {line}\n" for line in row.printed)
    if row.op is None:
        return lines
    indented = lines.replace(f"[{node.name}]", f"    [{node.name}]")
    return f"--> Starting operation: Prepare the Proxmox host | {row.op} \n{indented}"


def last_line(node: hosts.LabHost, output: str) -> str:
    """The last line pyinfra printed for `node`, without its `[node] ` prefix."""
    prefix = f"[{node.name}] "
    return [line.strip()[len(prefix) :] for line in output.splitlines() if line.strip().startswith(prefix)][
        -1
    ]


@pytest.mark.parametrize("point", list(ROWS))
def test_fault_point_converges_to_a_clean_runs_state(
    point: str,
    clean_states: dict[str, dict[str, object]],
    make_host: MakeHost,
    pyinfra_cli: PyinfraCli,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row = ROWS[point]
    clean = clean_state(row.layout, clean_states, make_host, pyinfra_cli, monkeypatch)
    clean_files = cast(dict[str, str], clean["files"])
    node = make_host("reference", MODE[row.layout])
    boot.install(node, row.layout)
    faults.install(node)
    for path, text in row.damage.items():
        (node.root / path.lstrip("/")).write_text(text)
    before = {path: file_or_none(node, path) for path in clean_files}
    if row.fault is not None:
        faults.arm(node, row.fault, row.pattern, row.arg)

    faulted = deploy(pyinfra_cli, monkeypatch, node, row.extra or ALLOWED)

    if row.extra is not None:
        assert (faulted.rc, faults.fired(node), reboots(node)) == (0, [row.fault], 1), faulted.stderr
    elif row.fault is not None:
        assert faulted.rc == 1, faulted.stderr
        # A root login's connection is served by one sshd process below the listener.
        fired = "cut (sshd processes killed: 1)" if row.fault == "cut" else row.fault
        assert (faults.armed(node), faults.fired(node), reboots(node)) == (False, [fired], 0)
    assert expected_output(node, row) in faulted.stderr, faulted.stderr
    assert "Traceback" not in faulted.stderr, faulted.stderr
    if row.fault == "cut":
        assert last_line(node, faulted.stderr) == row.printed[-1], faulted.stderr
    for path, content in row.left.items():
        if isinstance(content, As):
            whole = (clean_files if content.run == "clean" else before)[content.path]
            assert whole is not None, content
            assert file_or_none(node, path) == whole[: content.length], path
        else:
            assert file_or_none(node, path) == content, path
    runs = [faulted] if row.fault is None or row.extra is not None else []
    while not runs or runs[-1].rc != 0:
        assert len(runs) < 2, runs[-1].stderr
        runs.append(deploy(pyinfra_cli, monkeypatch, node, ALLOWED))

    assert (len(runs), reboots(node)) == (1, 1), [run.stderr for run in runs]
    assert boot_state(node) == clean
    if row.layout == "systemd-boot":
        assert read(node, CMDLINE).startswith("root=")
    settled = deploy(pyinfra_cli, monkeypatch, node, ALLOWED)
    assert (settled.rc, settled.outcome) == (
        0,
        {"cmdline": "no_change", "vfio": "no_change", "reboot": "no_change"},
    ), settled.stderr
    assert reboots(node) == 1
