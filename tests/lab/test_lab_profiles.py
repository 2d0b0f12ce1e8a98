"""Switching profiles with deploy/site.py on a Proxmox lab node (pvesh stand-in, lab hypervisor, GRUB layout,
reboot stand-in, real systemd under nspawn, the stand-in NVIDIA apt repository and SGLang):

- a fresh `vm` deploy -> `baremetal` (refused to stop the running VM without `allow_reboot`, saying so;
  then with it: VM stopped, `onboot: 0`, vfio binding and `<vendor>_iommu=on` gone, `iommu=pt` kept, the
  host driver built for the Proxmox kernel with its device nodes, SGLang serving from the host) -> `lxc`
  (the host's SGLang parked, the driver kept, no reboot) -> `vm` again (host driver parked and
  blacklisted, GPUs on vfio-pci), which ends with the same managed files, device nodes, units and API
  state as the fresh deploy;
- the same for `vm` -> `lxc` -> `vm`: the container created with a device entry per GPU, started as a real
  lab host with those nodes, its userspace driver at the host module's version and SGLang inside it, the
  drift check reporting both versions when they differ.

The operator's own VM 150 and container 300 (onboot 1) keep their configs from start to end; VM 150 comes up
with each reboot of the node, as Proxmox starts onboot guests (the lab's reboot starts VMs only).
Each step's runs repeat until the step is complete (a container is a host only once it is up: one run
more), and the next run changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import boot, guest_payload, hosts, hub
from lab.images import CATALOGUE, image_bytes
from lab.pve import node as pve_node
from pvegpu.facts.nvidia import parse_version_file
from pvegpu.hook.bundle import BUNDLE_PATH
from tests.lab.test_lab_faults import (
    CONVERT,
    DISK,
    HOOK,
    IMAGE,
    KNOWN,
    PENDING,
    SNIPPET,
    STORAGE,
    guest_reached,
)
from tests.lab.test_lab_guest import RECIPE_ENV
from tests.lab.test_lab_vm import START, SYNC, VM

pytestmark = pytest.mark.lab

Cli = Callable[..., subprocess.CompletedProcess[str]]
INVENTORY = "tests/lab/inventories/host_role.py"
# What the VM's cloud image needs on the node: the storage's content types, the user-data, the hookscript.
CLOUD_FILES = (
    "/etc/pve/storage.cfg",
    "/var/lib/vz/snippets/pvegpu-100-user.yaml",
    "/var/lib/vz/snippets/pvegpu-hook",
)
IMAGE_FILE = "debian-12-genericcloud-amd64.qcow2"
# The cloud image and the hookscript's zipapp are binary: state() holds their sha256.
BINARY = (f"/var/lib/vz/import/{IMAGE_FILE}", BUNDLE_PATH)
# Everything pvegpu writes on the node or through the API, plus what the bootloader made of it.
MANAGED = (
    "/etc/default/grub.d/pvegpu.cfg",
    "/boot/grub/grub.cfg",
    "/etc/modprobe.d/pvegpu-vfio.conf",
    "/etc/modules-load.d/pvegpu-vfio.conf",
    "/etc/pvegpu/cmdline-tokens",
    "/etc/pve/mapping/pci.cfg",
    "/etc/pve/qemu-server/100.conf",
    "/etc/modules-load.d/pvegpu-nvidia.conf",
    "/etc/modprobe.d/pvegpu-nvidia-uvm.conf",
    "/etc/systemd/system/pvegpu-nvidia-devices.service",
    "/etc/systemd/system/sglang.service",
    "/etc/pvegpu/sglang.env",
    *CLOUD_FILES,
)
# Not pvegpu's: a VM and a container of the operator's own, which no switch may touch.
FOREIGN = ("/etc/pve/qemu-server/150.conf", "/etc/pve/lxc/300.conf")
UNITS = ("sglang.service", "pvegpu-nvidia-devices.service", "nvidia-persistenced.service")
DRIVER = "580.95.05"
# The node's driver comes from the stand-in repository; its module reports where the lab's version file is.
LAB_DRIVER = {
    "repository": guest_payload.REPOSITORY_URL,
    "version_file": guest_payload.VERSION_FILE,
    "allow_reboot": True,
}
SERVING = {
    "driver": LAB_DRIVER,
    "sglang": {"pip_args": ["--no-index", "--find-links", guest_payload.WHEEL_DIR], "start_timeout_s": 60},
}
# The reference box's GPUs span two NUMA nodes: the host-driver profiles let NCCL use P2P across them, with
# the reference box's P2P settings (8 channels, LL buffers for P2P).
P2P_SETTINGS = [
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS=1",
    "NCCL_DEBUG=INFO",
    "NCCL_MIN_NCHANNELS=8",
    "NCCL_P2P_LEVEL=SYS",
]
NODES_OF_8 = (
    *(f"/dev/nvidia{n} character special file c3:{n:x}" for n in range(8)),
    "/dev/nvidia-modeset character special file c3:fe",
    "/dev/nvidiactl character special file c3:ff",
)

HOST = "Prepare the Proxmox host | "
CMDLINE = HOST + "Set the kernel command line tokens pvegpu owns"
VFIO = HOST + "Bind GPU functions to vfio-pci at boot"
NO_VFIO = HOST + "Remove the vfio binding and nvidia blacklist of the vm profile"
REBOOT = HOST + "Reboot if the running kernel lacks the boot state, and verify"
PARK = "Stop the Q35 VM for a host-driver profile | Stop the VM and keep it from starting at boot"
DRIVER_PARK = (
    "Park what the host-driver profiles left on the host | "
    "Stop and disable what this profile does not use on the host"
)
CT_PARK = "Stop the GPU container for another profile | Stop the container and keep it from starting at boot"
CT = "Create and start the GPU container | "
CT_CONFIG = CT + "Create or converge the container with the GPU device entries"
CT_RAW = CT + "Write the raw lxc lines (devices before Proxmox 8.1, /dev/shm)"
CT_START = CT + "Start the container"
CT_DRIVER = CT + "Check the container's driver equals the host's kernel module"
NV = "Install the NVIDIA driver | "
NV_PACKAGES = NV + f"Install the open NVIDIA driver with its kernel module (dkms) {DRIVER}"
NV_USERSPACE = NV + f"Install the open NVIDIA userspace (no kernel module) {DRIVER}"
NV_DEVICES = NV + "Check the NVIDIA device nodes containers bind"
NV_VERIFY = NV + "Verify the GPUs, module flavour and version"
CONTAINER = {"lxc": {"vmid": 200, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"}}
# A fresh `vm` deploy: the VM made from the downloaded cloud image, started, its guest answering with the
# host key pvegpu gave it.
VM_OPS = {
    CMDLINE: "success",
    VFIO: "success",
    REBOOT: "success",
    SYNC: "success",
    STORAGE: "success",
    IMAGE: "success",
    SNIPPET: "success",
    HOOK: "success",
    CONVERT: "no_change",
    VM: "success",
    DISK: "success",
    START: "success",
    KNOWN: "success",
    PENDING: "no_change",
}
# Back on `vm`: the VM exists (its image is not looked at again), onboot 1 again and started; the mappings,
# the storage, the snippet, the hookscript, the disk and the guest's host key are as the fresh deploy left
# them.
VM_BACK = {
    CMDLINE: "success",
    VFIO: "success",
    REBOOT: "success",
    SYNC: "no_change",
    STORAGE: "no_change",
    SNIPPET: "no_change",
    HOOK: "no_change",
    CONVERT: "no_change",
    VM: "success",
    DISK: "no_change",
    START: "success",
    KNOWN: "no_change",
    PENDING: "no_change",
}


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
    foreign: bool | None = None,
    more: dict[str, Any] | None = None,
    also: tuple[str, ...] = (),
    check: bool = True,
) -> tuple[dict[str, str], str, str]:
    """(operation name -> outcome on `node`, stderr, stdout) of deploy/site.py on `node` (and the hosts
    `also`) with `profile` and the serving data (+ `more`). `foreign`: whether a reboot may stop the
    operator's running VM 150 (`allow_reboot_with_foreign_guests`, by default as `allow`)."""
    host = {"allow_reboot": allow, "allow_reboot_with_foreign_guests": allow if foreign is None else foreign}
    extra = {"node": {"profile": profile}, "pve_host": host, **SERVING, **(more or {})}
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps(extra))
    limits = [arg for name in (node.name, *also) for arg in ("--limit", name)]
    result = cli("--json", "-y", *limits, INVENTORY, "deploy/site.py", check=False)
    if check:
        assert result.returncode == 0, result.stderr
    elif result.returncode != 0:
        return {}, result.stderr, result.stdout  # pyinfra prints no --json results after an error
    return outcomes(result.stdout, node.name), result.stderr, result.stdout


def outcomes(stdout: str, name: str) -> dict[str, str]:
    """Operation name -> `success`, `error` and/or `no_change` for host `name` in pyinfra's --json output."""
    outcome = {}
    for op in json.loads(stdout)["results"]["operations"]:
        kinds = [kind for kind in ("success", "error", "no_change") if name in op[kind]]
        if kinds:
            outcome[op["name"]] = "+".join(kinds)
    return outcome


def ssh(host: hosts.LabHost, command: str) -> str:
    return subprocess.run(hosts.ssh_argv(host, command), check=True, capture_output=True, text=True).stdout


def pvesh(node: hosts.LabHost, command: str) -> Any:
    return json.loads(ssh(node, f"pvesh {command} --output-format json"))


def state(node: hosts.LabHost) -> dict[str, Any]:
    """The node's managed files, running command line, GPU drivers, loaded module, NVIDIA device nodes,
    driver units, the VM's status and whether its guest is up and answers, and the operator's own VM and
    container (files and status)."""
    files = {}
    for path in (*MANAGED, *FOREIGN):
        file = node.root / path.lstrip("/")
        files[path] = file.read_text() if file.is_file() else None
    for path in BINARY:
        file = node.root / path.lstrip("/")
        files[path] = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None
    module = node.root / guest_payload.VERSION_FILE.lstrip("/")
    units = ssh(node, f"systemctl is-active {' '.join(UNITS)} || true").split()
    return {
        "files": files,
        "running": boot.running_cmdline_file(node).read_text(),
        "drivers": node.gpu_drivers(),
        "module": loaded.version if (loaded := parse_version_file(lines(module))) else None,
        "device nodes": ssh(node, "stat -c '%n %F %t:%T' /dev/nvidia* 2>/dev/null || true").splitlines(),
        "units": dict(zip(UNITS, units, strict=True)),
        "vm": pvesh(node, f"get /nodes/{node.name}/qemu/100/status/current")["status"],
        "foreign": [
            pvesh(node, f"get /nodes/{node.name}/{kind}/{vmid}/status/current")["status"]
            for kind, vmid in (("qemu", 150), ("lxc", 300))
        ],
        "guest up": any(host.name == f"{node.name}v100" for host in hosts.list_hosts()),
        "guest answers": guest_answer(node),
    }


def guest_answer(node: hosts.LabHost) -> str | None:
    """The hostname the VM's guest answers with pvegpu's login key (the lab's own key does not log in to a
    cloud-init guest), None when no guest host is up."""
    up = any(host.name == f"{node.name}v100" for host in hosts.list_hosts())
    return guest_reached(node) if up else None


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def reboots(node: hosts.LabHost) -> int:
    return len((node.root / "var/log/pvegpu-lab/reboot.log").read_text().splitlines())


def cpu_vendor() -> str:
    return "amd" if "AuthenticAMD" in Path("/proc/cpuinfo").read_text() else "intel"


def lab_node(name: str) -> hosts.LabHost:
    """A Proxmox lab node under real systemd with GRUB and the stand-in NVIDIA repository."""
    node = pve_node.up(name, "reference", mode="nspawn")
    boot.install(node, "grub")
    guest_payload.install(node)
    template = CONTAINER["lxc"]["ostemplate"]
    ssh(node, f"pvesh create /nodes/{name}/qemu --vmid 150 --name other --memory 1024 --onboot 1")
    ssh(node, f"pvesh create /nodes/{name}/lxc --vmid 300 --ostemplate {template} --onboot 1")
    return node


def fresh_vm(cli: Cli, monkeypatch: pytest.MonkeyPatch, node: hosts.LabHost) -> dict[str, Any]:
    """A fresh `vm` deploy and its second run; the state it leaves."""
    fresh, log, _ = site(cli, monkeypatch, node, "vm", more=CONTAINER)
    assert {op: fresh[op] for op in VM_OPS} == VM_OPS
    assert (fresh[CT_PARK], fresh[DRIVER_PARK]) == ("no_change", "no_change")
    assert f"info: guest {node.name}v100 of {node.name} is not in this run's inventory" in log
    fresh_state = state(node)
    assert fresh_state["vm"] == "running"
    assert (fresh_state["guest up"], fresh_state["guest answers"]) == (True, f"{node.name}v100")
    assert fresh_state["files"][BINARY[0]] == hashlib.sha256(image_bytes(CATALOGUE[IMAGE_FILE])).hexdigest()
    assert None not in [fresh_state["files"][path] for path in (*CLOUD_FILES, *BINARY)]
    assert set(fresh_state["drivers"].values()) == {"vfio-pci"}
    assert (fresh_state["module"], fresh_state["device nodes"]) == (None, [])
    # The operator's VM 150 (onboot 1) came up with the node's reboot, as pve-guests.service starts it; pvegpu
    # never touched it (its conf is compared at the end). The lab's reboot starts VMs only: CT 300 stays down.
    assert fresh_state["foreign"] == ["running", "stopped"]
    assert "onboot: 1\n" in (fresh_state["files"]["/etc/pve/qemu-server/150.conf"] or "")
    again, _, _ = site(cli, monkeypatch, node, "vm", more=CONTAINER)
    assert set(again.values()) == {"no_change"}
    assert state(node) == fresh_state
    return fresh_state


UVM_DROP_IN = (
    "# Managed by pvegpu (role nvidia_driver, profiles lxc and baremetal): GPU peer-to-peer on the host "
    "hangs NCCL\n"
    "# on Blackwell workstation GPUs while nvidia_uvm runs with heterogeneous memory management (HMM).\n"
    "options nvidia_uvm uvm_disable_hmm=1\n"
)


def host_driver_installed(outcome: dict[str, str]) -> None:
    """The `pve-host` driver steps of a first `lxc` / `baremetal` run."""
    assert outcome[NV_PACKAGES] == "success"
    assert outcome[NV + "Load the NVIDIA modules at boot"] == "success"
    assert outcome[NV + "Turn off nvidia_uvm's HMM (P2P on the host hangs with it)"] == "success"
    assert outcome[NV + "Write pvegpu-nvidia-devices.service (device nodes before guests start)"] == "success"
    assert outcome[NV + "Enable and run pvegpu-nvidia-devices.service"] == "success"
    assert (outcome[NV_DEVICES], outcome[NV_VERIFY]) == ("success", "success")


def host_driver_state(node: hosts.LabHost, uvm: str) -> dict[str, Any]:
    """The node on its own driver: GPUs on nvidia, audio on snd_hda_intel, module loaded, every node; the
    VM parked, its guest gone."""
    now = state(node)
    assert (now["vm"], now["guest up"], now["guest answers"]) == ("stopped", False, None)
    assert now["drivers"] == {a: ("nvidia" if a.endswith(".0") else "snd_hda_intel") for a in now["drivers"]}
    assert now["module"] == DRIVER
    assert sorted(now["device nodes"]) == sorted(
        [
            *NODES_OF_8,
            f"/dev/nvidia-uvm character special file {uvm}:0",
            f"/dev/nvidia-uvm-tools character special file {uvm}:1",
        ]
    )
    assert now["units"]["pvegpu-nvidia-devices.service"] == "active"
    assert now["files"]["/etc/modprobe.d/pvegpu-vfio.conf"] is None
    running = now["running"].split()
    assert ("iommu=pt" in running, "pcie_port_pm=off" in running) == (True, True)
    assert now["files"]["/etc/modprobe.d/pvegpu-nvidia-uvm.conf"] == UVM_DROP_IN
    assert f"{cpu_vendor()}_iommu=on" not in running
    return now


def settings(env_file: str | None) -> list[str]:
    """The variable lines of an SGLang env file (its comments give the reasons)."""
    return [line for line in (env_file or "").splitlines() if line and not line.startswith("#")]


def models(host: hosts.LabHost) -> list[str]:
    """The model ids SGLang serves on `host` (its /v1/models)."""
    script = "import json, urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/v1/models').read().decode())"
    return [model["id"] for model in json.loads(ssh(host, f'python3 -c "{script}"'))["data"]]


def translation_rows(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, node: hosts.LabHost, report_dir: Path
) -> list[tuple[str, str]]:
    """(state, detail) of each `gpuN DMA translation` row of the doctor's report on `node`."""
    monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(report_dir))
    cli("-y", "--limit", node.name, INVENTORY, "deploy/doctor.py")
    rows = json.loads((report_dir / f"{node.name}.json").read_text())["checks"]
    return [(row["state"], row["detail"]) for row in rows if row["check"].endswith(" DMA translation")]


def uvm_major(node: hosts.LabHost) -> str:
    """The stand-in's nvidia-uvm major, in stat's hex."""
    return ssh(node, "stat -c '%t' /dev/nvidia-uvm").strip()


def test_switch_vm_baremetal_lxc_vm_ends_as_a_fresh_vm_deploy(
    pve_name: str, pyinfra_cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = lab_node(pve_name)
    fresh_state = fresh_vm(pyinfra_cli, monkeypatch, node)
    # The node fetched the model into its one store, each file once; the VM reads it through virtiofs.
    fetched = hub_gets(node)
    assert sorted(fetched) == sorted(["config.json", "model.safetensors.index.json", *hub.SHARDS])
    assert "virtiofs0: pvegpu-models\n" in (fresh_state["files"]["/etc/pve/qemu-server/100.conf"] or "")
    assert (node.root / "etc/pve/mapping/directory.cfg").read_text() == (
        f"pvegpu-models\n\tmap node={pve_name},path={STORE}\n"
        f"\tdescription pvegpu model store pvegpu-owner: {pve_name}\n\n"
    )

    # baremetal, not allowed to reboot: the running VM is not stopped, and the run says what it would do.
    held, log, _ = site(pyinfra_cli, monkeypatch, node, "baremetal", allow=False)

    assert (
        f"[{pve_name}] profile baremetal: VM 100 is running on {pve_name} with the GPUs; would stop it and "
        "set onboot 0 (pve_host.allow_reboot is false: not stopping it)\n"
    ) in log
    assert held[PARK] == "no_change"
    assert held[REBOOT] == "no_change"
    # The GPUs stay on vfio-pci: no host driver, no serving yet, and the run says why.
    assert not [op for op in held if op.startswith((NV, "Serve the model"))]
    assert (
        f"[{pve_name}] profile baremetal: {', '.join(sorted(node.gpu_drivers()))} still bound to vfio-pci "
        "until the host reboots (pve_host.allow_reboot is false): not installing the host driver or serving "
        "yet\n"
    ) in log
    assert pvesh(node, f"get /nodes/{pve_name}/qemu/100/status/current")["status"] == "running"
    assert reboots(node) == 1

    # Allowed to reboot, but the operator's VM 150 runs: refused before anything is changed.
    _, refused, _ = site(pyinfra_cli, monkeypatch, node, "baremetal", foreign=False, check=False)
    assert (
        f"not rebooting {pve_name}: it would stop what is not pvegpu's: running VM 150 (other); stop or "
        "migrate them, or set pve_host.allow_reboot_with_foreign_guests: true"
    ) in refused
    assert "Traceback" not in refused
    assert pvesh(node, f"get /nodes/{pve_name}/qemu/100/status/current")["status"] == "running"
    assert pvesh(node, f"get /nodes/{pve_name}/qemu/100/config")["onboot"] == 1
    assert reboots(node) == 1

    baremetal, _, _ = site(pyinfra_cli, monkeypatch, node, "baremetal")

    assert {op: baremetal[op] for op in (PARK, CMDLINE, NO_VFIO, REBOOT)} == {
        PARK: "success",
        CMDLINE: "no_change",
        NO_VFIO: "no_change",
        REBOOT: "success",
    }
    host_driver_installed(baremetal)
    assert baremetal["Serve the model with SGLang | Wait for SGLang to answer"] == "success"
    bare = host_driver_state(node, uvm_major(node))
    assert pvesh(node, f"get /nodes/{pve_name}/qemu/100/config")["onboot"] == 0
    assert bare["units"] == dict.fromkeys(UNITS, "active")
    assert (
        'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt pcie_port_pm=off"\n'
        in bare["files"]["/etc/default/grub.d/pvegpu.cfg"]
    )
    assert bare["files"]["/etc/pve/mapping/pci.cfg"] == fresh_state["files"]["/etc/pve/mapping/pci.cfg"]
    # The host itself serves its store's checkpoint, with the P2P plan and the recipe P2P allows.
    assert settings(bare["files"]["/etc/pvegpu/sglang.env"]) == [*P2P_SETTINGS, *RECIPE_ENV]
    assert (
        "# Profile baremetal: the host driver gives P2P between the GPUs"
        in bare["files"]["/etc/pvegpu/sglang.env"]
    )
    assert models(node) == ["glm-5"]
    settled, _, _ = site(pyinfra_cli, monkeypatch, node, "baremetal")
    assert set(settled.values()) == {"no_change"}
    assert reboots(node) == 2
    # Booted with iommu=pt: the doctor sees every GPU's DMA untranslated (the P2P hang needs translation).
    assert (
        translation_rows(pyinfra_cli, monkeypatch, node, tmp_path)
        == [("ok", "passthrough (identity): the IOMMU does not translate the GPU's DMA")] * 8
    )
    kernel_update_is_guarded(pyinfra_cli, monkeypatch, node, tmp_path)
    assert reboots(node) == 3

    # baremetal -> lxc: the host's SGLang stops (the container serves); the driver stays, no reboot.
    moved, _, _ = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER)
    assert moved[DRIVER_PARK] == "success"
    # The container reads the node's store read-only at the store's own path.
    ct_config = pvesh(node, f"get /nodes/{pve_name}/lxc/200/config")
    assert ct_config["mp0"] == f"{STORE},mp={STORE},ro=1"
    assert (moved[CT_CONFIG], moved[CT_START], moved[NV_PACKAGES]) == ("success", "success", "no_change")
    on_lxc = host_driver_state(node, uvm_major(node))
    assert on_lxc["units"] == {**dict.fromkeys(UNITS, "active"), "sglang.service": "inactive"}
    assert [
        on_lxc["files"][path] for path in ("/etc/systemd/system/sglang.service", "/etc/pvegpu/sglang.env")
    ] == [
        None,
        None,
    ]
    assert reboots(node) == 3

    back_to_vm_as_fresh(pyinfra_cli, monkeypatch, node, fresh_state)
    # vm -> baremetal -> lxc -> vm served the one store: nothing was downloaded again.
    assert hub_gets(node) == fetched


def back_to_vm_as_fresh(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, node: hosts.LabHost, fresh_state: dict[str, Any]
) -> None:
    """From `lxc` back to `vm`: the host driver and the container parked, the VM back as `fresh_state`."""
    back, _, _ = site(cli, monkeypatch, node, "vm", more=CONTAINER)

    assert (back[DRIVER_PARK], back[CT_PARK]) == ("success", "success")
    # The VM exists: its image is not looked at again.
    assert {op: back.get(op) for op in (*VM_BACK, IMAGE)} == {**VM_BACK, IMAGE: None}
    assert state(node) == fresh_state  # the guest is back, answering with the same keys
    # The driver stays installed, blacklisted by the vfio drop-in, and is not loaded.
    assert ssh(node, "dpkg-query -W -f '${Status} ${Version}' nvidia-open") == (
        f"install ok installed {DRIVER}-1"
    )
    assert "blacklist nvidia\n" in (fresh_state["files"]["/etc/modprobe.d/pvegpu-vfio.conf"] or "")
    settled, _, _ = site(cli, monkeypatch, node, "vm", more=CONTAINER)
    assert set(settled.values()) == {"no_change"}
    assert reboots(node) == 4


STORE = "/var/lib/pvegpu/models/GLM-5-NVFP4-MTP"  # the node's model store (inventory/lab.py `model`)


def hub_gets(node: hosts.LabHost) -> list[str]:
    """The files the node's stand-in hub sent (lab/hub.py: each GET of a file's bytes), in order."""
    log = node.state_dir / "hub" / "requests.jsonl"
    requests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [
        str(r["path"]).rsplit("/", 1)[1]
        for r in requests
        if r["method"] == "GET" and "/resolve/" in str(r["path"]) and r["status"] in (200, 206)
    ]


def serves_with_p2p(container_env: str) -> None:
    """The container's service environment: the P2P NCCL plan and, as it serves the lab's stand-in
    checkpoint (inventory/lab.py), the recipe with the all-reduce fusion its GPUs' P2P allows."""
    assert settings(container_env) == [*P2P_SETTINGS, *RECIPE_ENV]
    assert "\n# sglang --flashinfer-allreduce-fusion-backend auto: " in container_env
    assert "# Profile lxc: the host driver gives P2P between the GPUs" in container_env


def kernel_update_is_guarded(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, node: hosts.LabHost, tmp_path: Path
) -> None:
    """On its own driver the node's next kernel has the module (the stand-in DKMS built it for the node's
    image); a kernel update without it is named by the doctor and refuses the next reboot, before anything
    is written; once built (`dkms autoinstall -k`), the reboot goes ahead once."""
    monkeypatch.setenv("PVEGPU_DOCTOR_DIR", str(tmp_path))
    doctor = cli("-y", "--limit", node.name, INVENTORY, "deploy/doctor.py").stderr
    assert f"[{node.name}] next boot: kernel {boot.KERNEL}: NVIDIA module {DRIVER} built by DKMS\n" in doctor
    update = "99.1.0-1-pve"
    (node.root / f"boot/vmlinuz-{update}").write_text("pvegpu lab STAND-IN kernel image\n")
    missing = (
        f"kernel {update} (next boot) has no NVIDIA module {DRIVER} built by DKMS (built: none): apt install "
        f"proxmox-headers-{update}, then dkms autoinstall -k {update}; or pin the running kernel: "
        f"proxmox-boot-tool kernel pin {ssh(node, 'uname -r').strip()}"
    )
    doctor = cli("-y", "--limit", node.name, INVENTORY, "deploy/doctor.py").stderr
    assert f"[{node.name}] next boot: {missing}\n" in doctor
    running = boot.running_cmdline_file(node)
    running.write_text(running.read_text().replace(" pcie_port_pm=off", ""))  # a reboot is due
    before = reboots(node)
    _, refused, _ = site(cli, monkeypatch, node, "baremetal", check=False)
    assert f"{node.name}: reboot refused: {missing}" in refused
    assert "Traceback" not in refused
    assert reboots(node) == before
    built = node.root / f"var/lib/dkms/nvidia/{DRIVER}/{update}/x86_64/module"
    built.mkdir(parents=True)
    (built / "nvidia.ko").write_text("")
    fixed, _, _ = site(cli, monkeypatch, node, "baremetal")
    assert fixed[REBOOT] == "success"
    assert reboots(node) == before + 1
    again, _, _ = site(cli, monkeypatch, node, "baremetal")
    assert set(again.values()) == {"no_change"}


def test_switch_vm_lxc_vm_container_serves_on_the_host_driver_then_fresh_vm_state(
    pve_name: str, pyinfra_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = lab_node(pve_name)
    fresh_state = fresh_vm(pyinfra_cli, monkeypatch, node)
    container = f"{pve_name}c200"

    lxc, log, _ = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER)

    assert {op: lxc[op] for op in (PARK, CMDLINE, NO_VFIO, REBOOT)} == {
        PARK: "success",
        CMDLINE: "success",
        NO_VFIO: "success",
        REBOOT: "success",
    }
    host_driver_installed(lxc)
    assert (lxc[CT_CONFIG], lxc[CT_RAW], lxc[CT_START], lxc[CT_DRIVER]) == (
        "success",
        "success",
        "success",
        "no_change",
    )
    # Read before this run installed anything: nothing to compare yet, and the run says so.
    assert (
        f"[{pve_name}] CT 200: the host has no NVIDIA kernel module loaded: the container's driver has "
        "nothing to match\n"
    ) in log
    uvm = uvm_major(node)
    host_driver_state(node, uvm)
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
    ct = hosts.get_host(container)
    # The container has every node of the host, with the host's numbers.
    assert sorted(ssh(ct, "stat -c '%n %F %t:%T' /dev/nvidia*").splitlines()) == sorted(
        [
            *NODES_OF_8,
            f"/dev/nvidia-uvm character special file {uvm}:0",
            f"/dev/nvidia-uvm-tools character special file {uvm}:1",
        ]
    )

    # The container is a host now: its userspace driver and SGLang; the node changes nothing.
    inside, _, stdout = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER, also=(container,))
    assert set(inside.values()) == {"no_change"}
    served = outcomes(stdout, container)
    assert (served[NV_USERSPACE], served[NV + "Check the host's kernel module is the pinned one"]) == (
        "success",
        "no_change",
    )
    assert (served[NV_VERIFY], served["Serve the model with SGLang | Wait for SGLang to answer"]) == (
        "success",
        "success",
    )
    settled, _, stdout = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER, also=(container,))
    assert set(settled.values()) == {"no_change"}
    assert set(outcomes(stdout, container).values()) == {"no_change"}
    # Userspace only: no module package, and apt refuses one.
    assert ssh(ct, "dpkg-query -W -f '${Package} ${Version}\\n' 'nvidia-*' 'dkms' 2>/dev/null; true").split(
        "\n"
    ) == [f"nvidia-driver-cuda {DRIVER}-1", ""]
    refused = subprocess.run(
        hosts.ssh_argv(ct, "apt-get install -s nvidia-kernel-open-dkms"),
        check=False,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 100
    assert "Package 'nvidia-kernel-open-dkms' has no installation candidate" in refused.stderr
    assert ssh(ct, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split() == [DRIVER] * 8
    assert models(ct) == ["glm-5"]
    serves_with_p2p(ssh(ct, "cat /etc/pvegpu/sglang.env"))

    # Drift: another userspace build in the container is reported with both versions.
    other = f"{guest_payload.APT_DIR}/nvidia-driver-cuda_590.48.01-1_all.deb"
    ssh(ct, f"dpkg -i {other} >/dev/null")
    drift, log, _ = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER, check=False)
    assert drift == {}  # the run failed
    assert (
        "CT 200: driver version mismatch: host kernel module 580.95.05, container userspace 590.48.01 (NVML "
        "fails with 'Driver/library version mismatch'; install the container's userspace at 580.95.05, "
        "without a kernel module)"
    ) in log
    ssh(ct, f"dpkg -i {guest_payload.APT_DIR}/nvidia-driver-cuda_{DRIVER}-1_all.deb >/dev/null")
    settled, _, _ = site(pyinfra_cli, monkeypatch, node, "lxc", more=CONTAINER)
    assert set(settled.values()) == {"no_change"}

    back, _, _ = site(pyinfra_cli, monkeypatch, node, "vm", more=CONTAINER)

    assert (back[CT_PARK], back[DRIVER_PARK]) == ("success", "success")
    # The VM exists: its image is not looked at again.
    assert {op: back.get(op) for op in (*VM_BACK, IMAGE)} == {**VM_BACK, IMAGE: None}
    assert state(node) == fresh_state  # the guest is back, answering with the same keys
    # The container is kept (its disk is data), stopped and not started at boot.
    assert pvesh(node, f"get /nodes/{pve_name}/lxc/200/status/current")["status"] == "stopped"
    assert pvesh(node, f"get /nodes/{pve_name}/lxc/200/config")["onboot"] == 0
    assert container not in [host.name for host in hosts.list_hosts()]
    settled, _, _ = site(pyinfra_cli, monkeypatch, node, "vm", more=CONTAINER)
    assert set(settled.values()) == {"no_change"}
