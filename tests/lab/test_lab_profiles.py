"""Switching profiles with deploy/site.py on a Proxmox lab node (pvesh stand-in, lab hypervisor, GRUB layout,
reboot stand-in): a fresh `vm` deploy -> `baremetal` (refused to stop the running VM without
`allow_reboot`, saying so; then with it: VM stopped, `onboot: 0`, vfio binding and `amd_iommu=on`/
`intel_iommu=on` gone, `iommu=pt` kept, GPUs off vfio-pci after the reboot) -> `vm` again, which ends with
the same managed files and API state as the fresh deploy. Each step's second run changes nothing.

The serving roles (driver, SGLang) are not part of these runs: tests/lab/inventories/host_role.py puts
the node in `pve_nodes` only, so site.py runs the host and VM side of the switch.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import boot, hosts
from lab.pve import node as pve_node

pytestmark = pytest.mark.lab

Cli = Callable[..., subprocess.CompletedProcess[str]]
INVENTORY = "tests/lab/inventories/host_role.py"
# Everything pvegpu writes on the node or through the API, plus what the bootloader made of it.
MANAGED = (
    "/etc/default/grub.d/pvegpu.cfg",
    "/boot/grub/grub.cfg",
    "/etc/modprobe.d/pvegpu-vfio.conf",
    "/etc/modules-load.d/pvegpu-vfio.conf",
    "/etc/pvegpu/cmdline-tokens",
    "/etc/pve/mapping/pci.cfg",
    "/etc/pve/qemu-server/100.conf",
)

HOST = "Prepare the Proxmox host | "
CMDLINE = HOST + "Set the kernel command line tokens pvegpu owns"
VFIO = HOST + "Bind GPU functions to vfio-pci at boot"
NO_VFIO = HOST + "Remove the vfio binding and nvidia blacklist of the vm profile"
REBOOT = HOST + "Reboot if the running kernel lacks the boot state, and verify"
SYNC = "Sync the PCI mappings | Sync the PCI mappings with the live IOMMU groups"
VM = "Create and start the Q35 VM | Create or converge the Q35 VM"
START = "Create and start the Q35 VM | Start the VM and wait until it runs"
PARK = "Stop the Q35 VM for a host-driver profile | Stop the VM and keep it from starting at boot"
CT_PARK = "Stop the GPU container for another profile | Stop the container and keep it from starting at boot"
CT = "Create and start the GPU container | "
CT_CONFIG = CT + "Create or converge the container with the GPU device entries"
CT_RAW = CT + "Write the raw lxc lines (devices before Proxmox 8.1, /dev/shm)"
CT_START = CT + "Start the container"
CT_DRIVER = CT + "Check the container's driver equals the host's kernel module"
CONTAINER = {"lxc": {"vmid": 200, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"}}
# What the host's nvidia driver creates (stand-ins: the lab node has no driver; Proxmox checks they exist).
NVIDIA_NODES = [
    *(f"/dev/nvidia{n} c 195 {n}" for n in range(8)),
    "/dev/nvidiactl c 195 255",
    "/dev/nvidia-modeset c 195 254",
    "/dev/nvidia-uvm c 508 0",
    "/dev/nvidia-uvm-tools c 508 1",
]


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"p{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def site(
    cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    node: hosts.LabHost,
    profile: str,
    *,
    allow: bool = True,
    more: dict[str, Any] | None = None,
) -> tuple[dict[str, str], str]:
    """(operation name -> outcome, stderr) of deploy/site.py on `node` with `profile` (+ `more` data)."""
    extra = {"node": {"profile": profile}, "pve_host": {"allow_reboot": allow}, **(more or {})}
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps(extra))
    result = cli("--json", "-y", "--limit", node.name, INVENTORY, "deploy/site.py", check=False)
    assert result.returncode == 0, result.stderr
    outcome = {}
    for op in json.loads(result.stdout)["results"]["operations"]:
        outcome[op["name"]] = "+".join(kind for kind in ("success", "error", "no_change") if op[kind])
    return outcome, result.stderr


def pvesh(node: hosts.LabHost, command: str) -> Any:
    argv = hosts.ssh_argv(node, f"pvesh {command} --output-format json")
    return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)


def drivers(node: hosts.LabHost) -> dict[str, str | None]:
    """GPU function -> the driver bound to it on the node's sysfs."""
    sysfs = node.root / node.sysfs_root.lstrip("/") / "bus/pci/devices"
    bound = {}
    for gpu in node.manifest()["gpus"]:
        for address in gpu["functions"]:
            link = sysfs / address / "driver"
            bound[address] = link.readlink().name if link.is_symlink() else None
    return bound


def state(node: hosts.LabHost) -> dict[str, Any]:
    """The node's managed files, running command line, GPU drivers and the VM's status."""
    files = {}
    for path in MANAGED:
        file = node.root / path.lstrip("/")
        files[path] = file.read_text() if file.is_file() else None
    return {
        "files": files,
        "running": boot.running_cmdline_file(node).read_text(),
        "drivers": drivers(node),
        "vm": pvesh(node, f"get /nodes/{node.name}/qemu/100/status/current")["status"],
        "guest up": any(host.name == f"{node.name}v100" for host in hosts.list_hosts()),
    }


def reboots(node: hosts.LabHost) -> int:
    return len((node.root / "var/log/pvegpu-lab/reboot.log").read_text().splitlines())


def cpu_vendor() -> str:
    return "amd" if "AuthenticAMD" in Path("/proc/cpuinfo").read_text() else "intel"


def test_switch_vm_baremetal_vm_ends_as_a_fresh_vm_deploy(
    pve_name: str, pyinfra_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = pve_node.up(pve_name, "reference")
    boot.install(node, "grub")
    vendor = cpu_vendor()

    fresh, _ = site(pyinfra_cli, monkeypatch, node, "vm")

    assert fresh == {
        CMDLINE: "success",
        VFIO: "success",
        REBOOT: "success",
        SYNC: "success",
        VM: "success",
        START: "success",
    }
    fresh_state = state(node)
    assert fresh_state["vm"] == "running"
    assert set(fresh_state["drivers"].values()) == {"vfio-pci"}
    again, _ = site(pyinfra_cli, monkeypatch, node, "vm")
    assert set(again.values()) == {"no_change"}
    assert state(node) == fresh_state

    # baremetal, not allowed to reboot: the running VM is not stopped, and the run says what it would do.
    held, log = site(pyinfra_cli, monkeypatch, node, "baremetal", allow=False)

    assert (
        f"[{pve_name}] profile baremetal: VM 100 is running on {pve_name} with the GPUs; would stop it and "
        "set onboot 0 (pve_host.allow_reboot is false: not stopping it)\n"
    ) in log
    assert held[PARK] == "no_change"
    assert held[REBOOT] == "no_change"
    assert pvesh(node, f"get /nodes/{pve_name}/qemu/100/status/current")["status"] == "running"
    assert reboots(node) == 1

    baremetal, _ = site(pyinfra_cli, monkeypatch, node, "baremetal")

    assert baremetal == {PARK: "success", CMDLINE: "no_change", NO_VFIO: "no_change", REBOOT: "success"}
    bare = state(node)
    assert (bare["vm"], bare["guest up"]) == ("stopped", False)
    assert pvesh(node, f"get /nodes/{pve_name}/qemu/100/config")["onboot"] == 0
    assert bare["files"]["/etc/modprobe.d/pvegpu-vfio.conf"] is None
    assert bare["files"]["/etc/modules-load.d/pvegpu-vfio.conf"] is None
    assert (
        'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"\n'
        in bare["files"]["/etc/default/grub.d/pvegpu.cfg"]
    )
    running = bare["running"].split()
    assert "iommu=pt" in running
    assert f"{vendor}_iommu=on" not in running
    # No host driver on the node: the GPUs come back unbound, their audio functions on snd_hda_intel.
    assert bare["drivers"] == {a: (None if a.endswith(".0") else "snd_hda_intel") for a in bare["drivers"]}
    assert bare["files"]["/etc/pve/mapping/pci.cfg"] == fresh_state["files"]["/etc/pve/mapping/pci.cfg"]
    settled, _ = site(pyinfra_cli, monkeypatch, node, "baremetal")
    assert set(settled.values()) == {"no_change"}
    assert reboots(node) == 2

    back, _ = site(pyinfra_cli, monkeypatch, node, "vm")

    assert back == {
        CMDLINE: "success",
        VFIO: "success",
        REBOOT: "success",
        SYNC: "no_change",
        VM: "success",
        START: "success",
    }
    assert state(node) == fresh_state
    settled, _ = site(pyinfra_cli, monkeypatch, node, "vm")
    assert set(settled.values()) == {"no_change"}
    assert reboots(node) == 3


def test_switch_vm_lxc_vm_container_with_every_gpu_then_fresh_vm_state(
    pve_name: str,
    pyinfra_cli: Cli,
    lab_ssh: Callable[[hosts.LabHost, str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = pve_node.up(pve_name, "reference")
    boot.install(node, "grub")
    lab_ssh(node, "; ".join(f"mknod -m 666 {spec}" for spec in NVIDIA_NODES))

    fresh, _ = site(pyinfra_cli, monkeypatch, node, "vm", more=CONTAINER)

    assert fresh[CT_PARK] == "no_change"  # no container yet
    assert fresh[START] == "success"
    fresh_state = state(node)

    lxc, log = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER)

    assert lxc == {
        PARK: "success",
        CMDLINE: "success",
        NO_VFIO: "success",
        REBOOT: "success",
        CT_CONFIG: "success",
        CT_RAW: "success",
        CT_START: "success",
        CT_DRIVER: "no_change",
    }
    config = pvesh(node, f"get /nodes/{pve_name}/lxc/200/config")
    assert {key: value for key, value in config.items() if key.startswith("dev")} == {
        **{f"dev{n}": f"/dev/nvidia{n},gid=44" for n in range(8)},
        "dev8": "/dev/nvidiactl,gid=44",
        "dev9": "/dev/nvidia-uvm,gid=44",
        "dev10": "/dev/nvidia-uvm-tools,gid=44",
        "dev11": "/dev/nvidia-modeset,gid=44",
    }
    assert config["lxc"] == [["lxc.mount.entry", "tmpfs dev/shm tmpfs size=16G,nosuid,nodev,create=dir 0 0"]]
    assert pvesh(node, f"get /nodes/{pve_name}/lxc/200/status/current")["status"] == "running"
    assert (state(node)["vm"], state(node)["files"]["/etc/modprobe.d/pvegpu-vfio.conf"]) == ("stopped", None)
    # The lab node has no NVIDIA driver: nothing to compare yet, and the run says so.
    assert (
        f"[{pve_name}] CT 200: the host has no NVIDIA kernel module loaded: the container's driver has "
        "nothing to match\n"
    ) in log
    settled, _ = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER)
    assert set(settled.values()) == {"no_change"}

    back, _ = site(pyinfra_cli, monkeypatch, node, "vm", more=CONTAINER)

    assert back == {
        CT_PARK: "success",
        CMDLINE: "success",
        VFIO: "success",
        REBOOT: "success",
        SYNC: "no_change",
        VM: "success",
        START: "success",
    }
    assert state(node) == fresh_state
    # The container is kept (its disk is data), stopped and not started at boot.
    assert pvesh(node, f"get /nodes/{pve_name}/lxc/200/status/current")["status"] == "stopped"
    assert pvesh(node, f"get /nodes/{pve_name}/lxc/200/config")["onboot"] == 0
    settled, _ = site(pyinfra_cli, monkeypatch, node, "vm", more=CONTAINER)
    assert set(settled.values()) == {"no_change"}
