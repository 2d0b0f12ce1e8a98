"""The real pyinfra CLI reads the PCI fact of lab hosts over SSH; the lab inventory declares them exactly."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab import hosts

pytestmark = pytest.mark.lab

DEPLOY = Path(__file__).parent / "deploys/nvidia_report.py"
REPORT = "root/pvegpu-nvidia-functions.txt"

MakeHost = Callable[..., hosts.LabHost]
Deploy = Callable[..., dict[str, Any]]
PyinfraCli = Callable[..., subprocess.CompletedProcess[str]]


def expected_report(manifest: dict[str, Any]) -> str:
    """The deploy's report, from the generator's ground truth: every function of every NVIDIA card."""
    addresses = sorted(address for gpu in manifest["gpus"] for address in gpu["functions"])
    lines = []
    for address in addresses:
        device = manifest["devices"][address]
        pci_id = f"{device['vendor']}:{device['device']}"
        lines.append(f"{address} {pci_id} class={device['class']} group={device['iommu_group']}\n")
    return "".join(lines)


@pytest.mark.parametrize("mode", ["netns", "nspawn"])
def test_pci_fact_over_ssh_finds_8_gpus_with_audio_then_noop(
    make_host: MakeHost, lab_deploy: Deploy, mode: hosts.Mode
) -> None:
    host = make_host("reference", mode)
    manifest = host.manifest()
    # Ground truth of the reference box: 8 cards, each a GPU (class 03) + HDMI audio (class 0403) pair.
    assert len(manifest["gpus"]) == 8
    for gpu in manifest["gpus"]:
        assert gpu["functions"] == [f"{gpu['address']}.0", f"{gpu['address']}.1"]
        display, audio = (manifest["devices"][address] for address in gpu["functions"])
        assert (display["vendor"], display["device"], display["class"]) == ("10de", "2bb1", "0x030000")
        assert (audio["vendor"], audio["class"]) == ("10de", "0x040300")

    first = lab_deploy(DEPLOY, host)

    assert first["totals"] == {"hosts": 1, "success": 1, "error": 0, "no_change": 0}
    assert (host.root / REPORT).read_text() == expected_report(manifest)

    second = lab_deploy(DEPLOY, host)

    assert second["totals"] == {"hosts": 1, "success": 0, "error": 0, "no_change": 1}


def test_inventory_declares_each_host_as_a_node_with_strict_ssh(
    make_host: MakeHost, pyinfra_cli: PyinfraCli
) -> None:
    netns_host, nspawn_host = make_host("reference", "netns"), make_host("reference", "nspawn")

    listed = json.loads(pyinfra_cli("--json", "inventory/lab.py", "debug-inventory").stdout)

    def declared(host: hosts.LabHost, sysfs_root: str, cmdline_path: str) -> dict[str, Any]:
        return {
            "name": host.name,
            "groups": ["pve_nodes", "lab"],
            "data": {
                # group_data/all.py: TCP_NODELAY on pyinfra's SSH connections (pvegpu/pve/nodelay.py)
                "ssh_paramiko_connect_kwargs": {"transport_factory": "Function: pyinfra_transport"},
                "node": {
                    "name": host.name,
                    "profile": "vm",
                    "gpus": {"ids": ["10de:2bb1"], "count": 8},
                    "sysfs_root": sysfs_root,
                    "cmdline_path": cmdline_path,
                },
                "ssh_hostname": host.address,
                "ssh_port": 22,
                "ssh_user": "root",
                "ssh_key": str(host.key),
                "ssh_known_hosts_file": str(hosts.known_hosts_path()),
                "ssh_strict_host_key_checking": "yes",
                "ssh_look_for_keys": False,
                "ssh_allow_agent": False,
                "ssh_config_file": "/dev/null",
            },
        }

    assert listed == [
        declared(netns_host, "/sys", "/proc/cmdline"),
        declared(nspawn_host, "/opt/fakesys", "/opt/fakeproc/cmdline"),
    ]


@pytest.mark.parametrize(
    ("recorded", "error"),
    [
        pytest.param(
            "impostor", "SSH host key error (Host key for {address} does not match.)", id="impostor"
        ),
        pytest.param(
            "unknown",
            "SSH error (StrictPolicy: No host key for {address} found in known_hosts)",
            id="unknown",
        ),
    ],
)
def test_pyinfra_refuses_a_host_whose_key_is_not_recorded(
    make_host: MakeHost, pyinfra_cli: PyinfraCli, recorded: str, error: str
) -> None:
    first, second = make_host(), make_host()
    # impostor: the second host's key recorded for the first host's address; unknown: no line for it at all.
    first_line = f"{first.address} {second.host_key}\n" if recorded == "impostor" else ""
    hosts.known_hosts_path().write_text(f"{first_line}{second.address} {second.host_key}\n")

    result = pyinfra_cli("-y", "--limit", first.name, "inventory/lab.py", DEPLOY, check=False)

    assert result.returncode == 1
    assert f"    [{first.name}] {error.format(address=first.address)}\n" in result.stderr
    assert not (first.root / REPORT).exists()


def test_inventory_without_hosts_says_how_to_start_one(pyinfra_cli: PyinfraCli) -> None:
    assert hosts.list_hosts() == []

    result = pyinfra_cli("inventory/lab.py", DEPLOY, check=False)

    assert result.returncode == 1
    assert result.stderr.endswith(
        "inventory/lab.py: no lab host is up; start one: python -m lab up node --topology reference\n"
    )
