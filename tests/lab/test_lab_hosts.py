"""Lab hosts: they answer over SSH with their own identity, coexist, check host keys, and leave nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import hosts
from lab.errors import LabError

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]

Ssh = Callable[[hosts.LabHost, str], str]
Leftovers = Callable[[hosts.LabHost], list[str]]
MakeHost = Callable[..., hosts.LabHost]


def _known_hosts_lines() -> list[str]:
    return hosts.known_hosts_path().read_text().splitlines()


def test_netns_host_answers_with_its_identity_then_down_leaves_nothing(
    make_host: MakeHost, lab_ssh: Ssh, lab_leftovers: Leftovers
) -> None:
    host = make_host()
    devices = len(host.manifest()["devices"])

    answer = lab_ssh(
        host, "hostname; cat /proc/cmdline; ls /sys/bus/pci/devices | wc -l; readlink /proc/1/exe"
    )

    assert answer == f"{host.name}\n{hosts.FRESH_PVE_CMDLINE}{devices}\n/usr/bin/bash\n"
    assert (host.sysfs_root, host.cmdline_path) == ("/sys", "/proc/cmdline")
    scanned = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", host.address], check=True, capture_output=True, text=True
    ).stdout
    assert scanned == f"{host.address} {host.host_key}\n"  # the sshd presents the key the lab recorded
    assert _known_hosts_lines() == [f"{host.address} {host.host_key}"]

    assert hosts.down(host.name) is True
    assert lab_leftovers(host) == []
    assert hosts.down(host.name) is False


def test_two_hosts_run_side_by_side_and_stop_independently(
    make_host: MakeHost, lab_ssh: Ssh, lab_leftovers: Leftovers
) -> None:
    first, second = make_host(), make_host()

    assert first.address != second.address
    assert first.host_key != second.host_key
    assert sorted(_known_hosts_lines()) == sorted(f"{h.address} {h.host_key}" for h in (first, second))
    assert lab_ssh(first, "hostname") == f"{first.name}\n"
    assert lab_ssh(second, "hostname") == f"{second.name}\n"

    hosts.down(first.name)

    assert lab_leftovers(first) == []
    assert lab_ssh(second, "hostname; cat /etc/machine-id | wc -c") == f"{second.name}\n33\n"
    assert _known_hosts_lines() == [f"{second.address} {second.host_key}"]


def test_nspawn_host_boots_real_systemd_with_fake_sysfs_at_opt(
    make_host: MakeHost, lab_ssh: Ssh, lab_leftovers: Leftovers
) -> None:
    host = make_host(mode="nspawn")
    devices = len(host.manifest()["devices"])

    answer = lab_ssh(
        host,
        "systemctl is-system-running --wait; readlink /proc/1/exe; systemctl is-active ssh; hostname; "
        "cat /opt/fakeproc/cmdline; ls /opt/fakesys/bus/pci/devices | wc -l",
    )

    assert answer == (
        f"running\n/usr/lib/systemd/systemd\nactive\n{host.name}\n{hosts.FRESH_PVE_CMDLINE}{devices}\n"
    )
    assert (host.sysfs_root, host.cmdline_path) == ("/opt/fakesys", "/opt/fakeproc/cmdline")
    hosts.down(host.name)
    assert lab_leftovers(host) == []


def test_ssh_refuses_a_host_whose_key_is_not_the_recorded_one(make_host: MakeHost) -> None:
    first, second = make_host(), make_host()
    # Record the second host's key for the first host's address: the first host now looks like an impostor.
    hosts.known_hosts_path().write_text(f"{first.address} {second.host_key}\n")

    result = subprocess.run(hosts.ssh_argv(first, "true"), check=False, capture_output=True, text=True)

    assert result.returncode == 255
    assert "Host key verification failed." in result.stderr


def test_up_refuses_bad_names_unknown_topologies_and_taken_names(make_host: MakeHost) -> None:
    host = make_host()
    with pytest.raises(LabError) as taken:
        hosts.up(host.name, "reference")
    with pytest.raises(LabError) as bad_name:
        hosts.up("Node_1", "reference")
    with pytest.raises(LabError) as bad_topology:
        hosts.up("t999", "no-such-box")

    assert (
        str(taken.value)
        == f"lab host {host.name!r} is already up; stop it with: python -m lab down {host.name}"
    )
    assert str(bad_name.value) == (
        "host name 'Node_1': use 1-11 lowercase letters and digits, starting with a letter"
    )
    assert str(bad_topology.value).startswith("unknown topology 'no-such-box'; known: ")
    assert "reference" in str(bad_topology.value).split("known: ")[1].split(", ")
    assert not (hosts.run_dir() / "t999").exists()


def test_failed_up_raises_with_the_log_and_cleans_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    broken_init = tmp_path / "init.sh"
    broken_init.write_text("echo 'sshd: cannot start' >&2\nexit 3\n")
    monkeypatch.setattr(hosts, "_HOST_INIT", broken_init)
    name = f"f{os.getpid() % 10000}"

    with pytest.raises(LabError) as failed:
        hosts.up(name, "reference")

    state = hosts.run_dir() / name
    log = state / "console.log"
    assert (
        str(failed.value)
        == f"lab host {name} did not come up (exited); last lines of {log}:\nsshd: cannot start"
    )
    assert not state.exists()
    assert not Path("/run/netns", hosts.netns_name(name)).exists()
    assert not Path("/sys/class/net", hosts.netns_name(name)).exists()
    assert str(state) not in Path("/proc/self/mountinfo").read_text()
    assert hosts.list_hosts() == []


def test_cli_up_status_ssh_down(lab_leftovers: Leftovers) -> None:
    name = f"c{os.getpid() % 10000}"  # unique per session: network namespace names are machine-wide

    def lab(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "lab", *args], check=True, capture_output=True, text=True, cwd=REPO
        ).stdout

    lab("up", name, "--topology", "reference")
    host = hosts.get_host(name)
    try:
        described = (
            f"{name}\tup\tnetns\troot@{host.address}\ttopology=reference\tsysfs_root=/sys\t"
            f"cmdline_path=/proc/cmdline\troot={host.root}\n"
        )
        assert lab("status") == described
        assert lab("ssh", name, "hostname") == f"{name}\n"
    finally:
        assert lab("down", name) == f"stopped: {name}\n"
    assert lab_leftovers(host) == []
    assert lab("down", "--all") == "stopped: nothing\n"
