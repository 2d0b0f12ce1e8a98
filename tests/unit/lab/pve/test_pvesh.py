"""The lab's pvesh stand-in (lab/pve/pvesh.py), run as a program against generated sysfs trees.

Expected texts come from shared/knowledge/proxmox-api-behaviour.md and proxmox-pci-mapping.md (read from
Proxmox's source); the mappings are built here from the generator's manifest, as Proxmox's GUI builds them.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import fakesys

PVESH = Path(__file__).resolve().parents[4] / "lab/pve/pvesh.py"
NODE = "pve1"
UPID = re.compile(r'"(UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:(\w+):(\d+):root@pam:)"\n')


@dataclass
class Result:
    rc: int
    out: str
    err: str


@dataclass
class Pve:
    """A stand-in installation in a temporary directory: settings, state root, the node's sysfs tree."""

    base: Path

    @property
    def sysfs(self) -> Path:
        return self.base / "sys"

    @property
    def root(self) -> Path:
        return self.base / "root"

    def __call__(self, *args: str) -> Result:
        env = {"PVEGPU_LAB_PVE_CONFIG": str(self.base / "pve.json"), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, str(PVESH), *args], check=False, capture_output=True, text=True, env=env
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def json(self, *args: str) -> Any:
        result = self(*args, "--output-format", "json")
        assert (result.rc, result.err) == (0, ""), result
        return json.loads(result.out)

    def retopo(self, topology: str) -> dict[str, Any]:
        shutil.rmtree(self.sysfs)
        return fakesys.write_tree(self.sysfs, topology)

    def file(self, rel: str) -> str:
        return (self.root / rel).read_text()


@pytest.fixture
def pve(tmp_path: Path) -> Pve:
    installed = Pve(tmp_path)
    fakesys.write_tree(installed.sysfs, "reference")
    settings = {"node": NODE, "sysfs_root": str(installed.sysfs), "root": str(installed.root)}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    return installed


def map_line(manifest: dict[str, Any], index: int, node: str = NODE) -> str:
    """The `map` entry Proxmox's GUI writes for GPU `index` of a generated tree (function-less path)."""
    gpu = manifest["gpus"][index]
    device = manifest["devices"][gpu["functions"][0]]
    return (
        f"path={gpu['address']},node={node},id={device['vendor']}:{device['device']},"
        f"subsystem-id={device['subsystem_vendor']}:{device['subsystem_device']},iommugroup={gpu['iommu_group']}"
    )


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


REFERENCE = fakesys.manifest("reference")
GPU0 = map_line(REFERENCE, 0)  # path=0000:41:00,...,iommugroup=14
GPU1 = map_line(REFERENCE, 1)
MAPPING_USAGE = "pvesh create <api_path> --id <string> --map <array> [OPTIONS] [FORMAT_OPTIONS]\n"


def test_version_help_and_unknown_paths(pve: Pve) -> None:
    repoid = sha1("9.0.3")[:8]
    assert pve("get", "/version", "--output-format", "json") == Result(
        0, f'{{"release":"9.0","repoid":"{repoid}","version":"9.0.3"}}\n', ""
    )
    assert "STAND-IN for Proxmox VE's pvesh" in pve("--help").out
    assert pve("get", "/nodes/pve1/nothing") == Result(
        1, "", "No 'get' handler defined for '/nodes/pve1/nothing'\n"
    )
    assert pve("get", "/version", "--foo", "1") == Result(
        255, "", "Unknown option: foo\n400 unable to parse option\npvesh get <api_path> [FORMAT_OPTIONS]\n"
    )
    assert pve("get", "/nodes/pve2/qemu/100/config") == Result(
        255,
        "",
        "hostname lookup 'pve2' failed - failed to get address info for: pve2: Name or service not known\n",
    )


def test_create_mapping_writes_pci_cfg_like_sectionconfig_and_lists_it(pve: Pve) -> None:
    create = pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0, "-map", GPU1)
    assert create == Result(0, "", "")
    pve(
        "create", "/cluster/mapping/pci", "--id", "nic", "--map", GPU1, "--mdev", "no", "--description", "x y"
    )

    text = pve.file("etc/pve/mapping/pci.cfg")
    assert text == f"gpu0\n\tmap {GPU0}\n\tmap {GPU1}\n\nnic\n\tmap {GPU1}\n\tdescription x y\n\tmdev 0\n\n"
    digest = sha1(text)
    listed = pve.json("get", "/cluster/mapping/pci", "--check-node", NODE)
    assert listed == [
        {"id": "gpu0", "digest": digest, "type": "pci", "map": [GPU0, GPU1], "checks": []},
        {
            "id": "nic",
            "digest": digest,
            "type": "pci",
            "map": [GPU1],
            "description": "x y",
            "mdev": 0,
            "checks": [],
        },
    ]
    assert pve.json("get", "/cluster/mapping/pci/gpu0") == {
        "digest": digest,
        "map": [GPU0, GPU1],
        "type": "pci",
    }
    assert pve("get", "/cluster/mapping/pci/gpu9") == Result(255, "", "mapping 'gpu9' not found\n")
    assert pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0) == Result(
        255, "", "create hardware mapping failed: pci ID 'gpu0' already defined\n"
    )


@pytest.mark.parametrize(
    ("args", "errors"),
    [
        pytest.param(
            ["--id", "gpu0", "-map", f"['{GPU0}', '{GPU1}']"],
            "map[0]: invalid format - invalid key in comma-separated list property: ['path\n",
            id="proxmoxer-list-repr",
        ),
        pytest.param(["--id", "gpu0"], "map: property is missing and it is not optional\n", id="no-map"),
        pytest.param(
            ["--id", "Bad.Id", "--map", GPU0],
            "id: invalid format - invalid configuration ID 'Bad.Id'\n",
            id="bad-id",
        ),
        pytest.param(
            ["--id", "gpu0", "--map", "path=0000:41:00,node=pve_1,id=10DE:2BB1"],
            "map[0].node: invalid format - value does not look like a valid node name\n",
            id="bad-node",
        ),
        pytest.param(
            ["--id", "gpu0", "--map", "path=0000:41:00,id=10de:2bb1,iommugroup=x"],
            "map[0].iommugroup: type check ('integer') failed - got 'x'\n"
            "map[0].node: property is missing and it is not optional\n",
            id="two-errors",
        ),
        pytest.param(
            ["--id", "gpu0", "--map", "path=0000:41:00,node=pve1,id=10de:2bb1,foo=1"],
            "map[0]: invalid format - invalid key in comma-separated list property: foo\n",
            id="unknown-key",
        ),
    ],
)
def test_create_mapping_refuses_invalid_parameters(pve: Pve, args: list[str], errors: str) -> None:
    result = pve("create", "/cluster/mapping/pci", *args)

    assert result == Result(255, "", f"400 Parameter verification failed.\n{errors}{MAPPING_USAGE}")
    assert not (pve.root / "etc/pve/mapping/pci.cfg").exists()


def test_update_mapping_needs_the_current_digest_and_the_whole_map(pve: Pve) -> None:
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0)
    before = pve.file("etc/pve/mapping/pci.cfg")
    prefix = "update hardware mapping failed: "

    stale = pve("set", "/cluster/mapping/pci/gpu0", "--map", GPU1, "--digest", sha1("someone else's"))
    no_map = pve("set", "/cluster/mapping/pci/gpu0", "--description", "d")
    missing = pve("set", "/cluster/mapping/pci/gpu7", "--map", GPU1)

    assert stale == Result(
        255, "", f"{prefix}detected modified configuration - file changed by other user? Try again.\n"
    )
    assert no_map == Result(255, "", f"{prefix}missing value for required option 'map'\n")
    assert missing == Result(255, "", f"{prefix}pci ID 'gpu7' does not exist\n")
    assert pve.file("etc/pve/mapping/pci.cfg") == before

    assert pve("set", "/cluster/mapping/pci/gpu0", "--map", GPU1, "--digest", sha1(before)) == Result(
        0, "", ""
    )
    assert pve.file("etc/pve/mapping/pci.cfg") == f"gpu0\n\tmap {GPU1}\n\n"
    assert pve("delete", "/cluster/mapping/pci/gpu0") == Result(0, "", "")
    assert pve("delete", "/cluster/mapping/pci/gpu0") == Result(0, "", "")
    assert pve.file("etc/pve/mapping/pci.cfg") == ""


def _task(pve: Pve, result: Result, task_type: str) -> dict[str, Any]:
    match = UPID.fullmatch(result.out.splitlines(keepends=True)[-1])
    assert match is not None, result
    assert (result.rc, match.group(2), match.group(3)) == (0, task_type, "100")
    status: dict[str, Any] = pve.json("get", f"/nodes/pve1/tasks/{match.group(1)}/status")
    assert (status["upid"], status["status"], status["type"], status["id"]) == (
        match.group(1),
        "stopped",
        task_type,
        "100",
    )
    return status


VM_ARGS = ("--vmid", "100", "--name", "gpuvm", "--machine", "q35", "--bios", "ovmf", "--cores", "8")
VM_DISKS = ("--efidisk0", "local-lvm:1,efitype=4m", "--scsi0", "local-lvm:32", "--numa", "yes")


def test_create_vm_allocates_disks_and_writes_the_config_sorted(pve: Pve) -> None:
    pci = ("--hostpci0", "mapping=gpu0,pcie=1", "--net0", "virtio,bridge=vmbr0")
    result = pve("create", "/nodes/pve1/qemu", *VM_ARGS, *VM_DISKS, *pci, "--output-format", "json")

    assert result.out.splitlines()[:2] == [
        "efidisk0: successfully created disk 'local-lvm:vm-100-disk-0,efitype=4m,size=4M'",
        "scsi0: successfully created disk 'local-lvm:vm-100-disk-1,size=32G'",
    ]
    assert _task(pve, result, "qmcreate")["exitstatus"] == "OK"
    conf = pve.file("etc/pve/qemu-server/100.conf")
    generated = re.fullmatch(
        r"(?s).*meta: creation-qemu=9\.0\.3,ctime=\d+\n"
        r".*net0: virtio=(BC:24:11(:[0-9A-F]{2}){3}),bridge=vmbr0\n.*"
        r"smbios1: uuid=[0-9a-f-]{36}\nvmgenid: [0-9a-f-]{36}\n",
        conf,
    )
    assert generated is not None, conf
    assert [line.split(":")[0] for line in conf.splitlines()] == [
        "bios", "boot", "cores", "efidisk0", "hostpci0", "machine", "meta", "name", "net0", "numa", "scsi0",
        "smbios1", "vmgenid",
    ]  # fmt: skip
    config = pve.json("get", "/nodes/pve1/qemu/100/config")
    assert config["digest"] == sha1(conf)
    assert (config["boot"], config["cores"], config["numa"], config["hostpci0"]) == (
        "order=scsi0;net0",
        8,
        1,
        "mapping=gpu0,pcie=1",
    )
    assert pve("create", "/nodes/pve1/qemu", "--vmid", "100") == Result(
        255, "", "unable to create VM 100 - VM 100 already exists on node 'pve1'\n"
    )


@pytest.mark.parametrize(
    ("args", "stderr"),
    [
        pytest.param(
            ["--vmid", "99"],
            "400 Parameter verification failed.\n"
            "vmid: invalid format - value does not look like a valid VM ID\n",
            id="vmid-range",
        ),
        pytest.param(
            ["--vmid", "100", "--hostpci0", "0000:C1:00.0"],
            "400 Parameter verification failed.\nhostpci0.host: value does not match the regex pattern\n",
            id="hostpci-uppercase",
        ),
        pytest.param(
            ["--vmid", "100", "--hostpci0", "mapping=gpu0,multifunction=1"],
            "400 Parameter verification failed.\n"
            "hostpci0: invalid format - invalid key in comma-separated list property: multifunction\n",
            id="hostpci-unknown-key",
        ),
        pytest.param(["--vmid", "100", "--numa", "maybe"], "400 unable to parse option\n", id="boolean"),
        pytest.param(
            ["--vmid", "100", "--lxc.foo", "1"],
            "Unknown option: lxc.foo\n400 unable to parse option\n",
            id="unknown",
        ),
    ],
)
def test_create_vm_validates_parameters(pve: Pve, args: list[str], stderr: str) -> None:
    usage = "pvesh create <api_path> --vmid <integer> (100 - 999999999) [OPTIONS] [FORMAT_OPTIONS]\n"
    assert pve("create", "/nodes/pve1/qemu", *args) == Result(255, "", stderr + usage)
    assert not (pve.root / "etc/pve/qemu-server/100.conf").exists()


def test_vm_update_start_pending_and_stop(pve: Pve) -> None:
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0)
    pve("create", "/cluster/mapping/pci", "--id", "gpu1", "--map", GPU1)
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, "--hostpci0", "mapping=gpu0,pcie=1")
    digest = pve.json("get", "/nodes/pve1/qemu/100/config")["digest"]

    stale = pve("set", "/nodes/pve1/qemu/100/config", "--cores", "4", "--digest", sha1("old"))
    update = pve("set", "/nodes/pve1/qemu/100/config", "--cores", "4", "--delete", "bios", "--digest", digest)

    assert stale == Result(255, "", "checksum mismatch (file change by other user?)\n")
    assert update == Result(0, "update VM 100: -cores 4 -delete bios\n", "")
    assert pve("create", "/nodes/pve1/qemu/100/status/stop").err == ""  # stopping a stopped VM is OK
    start = pve("create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json")
    assert start.err == ""
    assert _task(pve, start, "qmstart")["exitstatus"] == "OK"
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "running"
    again = pve("create", "/nodes/pve1/qemu/100/status/start")
    assert again.err == "VM 100 already running\n"

    pve("set", "/nodes/pve1/qemu/100/config", "--hostpci1", "mapping=gpu1,pcie=1", "--name", "renamed")

    conf = pve.file("etc/pve/qemu-server/100.conf")
    assert "name: renamed\n" in conf
    assert conf.endswith("\n[PENDING]\nhostpci1: mapping=gpu1,pcie=1\n")
    assert "hostpci1" not in pve.json("get", "/nodes/pve1/qemu/100/config", "--current", "1")
    assert pve.json("get", "/nodes/pve1/qemu/100/config")["hostpci1"] == "mapping=gpu1,pcie=1"
    stop = pve("create", "/nodes/pve1/qemu/100/status/stop", "--output-format", "json")
    assert _task(pve, stop, "qmstop")["exitstatus"] == "OK"
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "stopped"


def test_bios_renumbered_start_fails_with_proxmox_message_until_the_mapping_is_repaired(pve: Pve) -> None:
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0)
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, "--hostpci0", "mapping=gpu0,pcie=1")
    renumbered = pve.retopo("reference-renumbered")
    # 0000:41:00 now holds another card of the same model: same ids, another IOMMU group.
    group = renumbered["devices"]["0000:41:00.0"]["iommu_group"]
    assert group != REFERENCE["devices"]["0000:41:00.0"]["iommu_group"] == 14

    start = pve("create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json")

    message = (
        "PCI device mapping invalid (hardware probably changed): "
        f"'iommugroup' does not match for 'gpu0' ({group} != 14) "
    )
    assert start.err == message + "\n"
    status = _task(pve, start, "qmstart")
    assert status["exitstatus"] == message
    log = next((pve.root / "var/log/pve/tasks").glob(f"*/{status['upid']}")).read_text()
    assert log == f"\nTASK ERROR: {message}\n"
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "stopped"
    checks = pve.json("get", "/cluster/mapping/pci", "--check-node", NODE)[0]["checks"]
    assert checks == [
        {
            "severity": "error",
            "message": f"Invalid configuration: 'iommugroup' does not match for 'gpu0' ({group} != 14)\n",
        }
    ]

    digest = pve.json("get", "/cluster/mapping/pci/gpu0")["digest"]
    pve("set", "/cluster/mapping/pci/gpu0", "--map", map_line(renumbered, 0), "--digest", digest)
    repaired = pve("create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json")

    assert _task(pve, repaired, "qmstart")["exitstatus"] == "OK"
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "running"


@pytest.mark.parametrize(
    ("hostpci", "mapping", "error"),
    [
        pytest.param("mapping=gpu5,pcie=1", None, "PCI device mapping not found for 'gpu5'", id="no-mapping"),
        pytest.param(
            "mapping=gpu0,pcie=1",
            GPU0.replace("node=pve1", "node=pve2"),
            "PCI device mapping not found for 'gpu0'",
            id="other-node",
        ),
        pytest.param(
            "mapping=gpu0,pcie=1",
            GPU0.replace("path=0000:41:00", "path=0000:42:00"),
            "PCI device mapping invalid (hardware probably changed): pci device '0000:42:00.0' not found ",
            id="moved",
        ),
        pytest.param(
            "mapping=gpu0,pcie=1",
            GPU0.replace(",subsystem-id=10de:204b", ""),
            "PCI device mapping invalid (hardware probably changed): "
            "missing expected property 'subsystem-id' for device '0000:41:00.0' ",
            id="no-subsystem",
        ),
        pytest.param(
            "mapping=gpu0,host=0000:41:00,pcie=1",
            GPU0,
            "Cannot set both 'host' and 'mapping'.",
            id="host+mapping",
        ),
    ],
)
def test_start_fails_in_the_task_with_qemu_server_texts(
    pve: Pve, hostpci: str, mapping: str | None, error: str
) -> None:
    if mapping is not None:
        pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", mapping)
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, "--hostpci0", hostpci)

    start = pve("create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json")

    assert start.err == error + "\n"
    assert _task(pve, start, "qmstart")["exitstatus"] == error


def test_task_status_refuses_bad_and_unknown_upids(pve: Pve) -> None:
    usage = "pvesh get <api_path> [FORMAT_OPTIONS]\n"
    unknown = "UPID:pve1:00001234:00005678:6B0CA5E7:qmstart:100:root@pam:"
    assert pve("get", "/nodes/pve1/tasks/UPID:x/status") == Result(
        255, "", f"400 Parameter verification failed.\nupid: unable to parse worker upid\n{usage}"
    )
    assert pve("get", f"/nodes/pve1/tasks/{unknown}/status") == Result(
        255, "", f"400 Parameter verification failed.\nupid: no such task\n{usage}"
    )


def test_lxc_config_keeps_raw_lines_checks_devices_and_digest(pve: Pve) -> None:
    conf = pve.root / "etc/pve/lxc/200.conf"
    conf.parent.mkdir(parents=True)
    original = "hostname: ct\nmemory: 2048\nunprivileged: 1\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    conf.write_text(original)
    (pve.root / "dev").mkdir()
    (pve.root / "dev/notadevice").write_text("")

    config = pve.json("get", "/nodes/pve1/lxc/200/config")
    missing = pve("set", "/nodes/pve1/lxc/200/config", "--dev0", "/dev/nvidia0")
    not_device = pve("set", "/nodes/pve1/lxc/200/config", "--dev0", "path=/dev/notadevice,mode=0666")
    stale = pve("set", "/nodes/pve1/lxc/200/config", "--cores", "2", "--digest", sha1("old"))
    raw = pve("set", "/nodes/pve1/lxc/200/config", "--lxc.cgroup2.devices.allow", "a")
    update = pve("set", "/nodes/pve1/lxc/200/config", "--cores", "2", "--digest", config["digest"])

    assert config == {
        "hostname": "ct",
        "memory": 2048,
        "unprivileged": 1,
        "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"]],
        "digest": sha1(original),
    }
    assert missing == Result(255, "", "Device /dev/nvidia0 does not exist\n")
    assert not_device == Result(255, "", "/dev/notadevice is not a device\n")
    assert stale == Result(
        255, "", "detected modified configuration - file changed by other user? Try again.\n"
    )
    assert raw.err.startswith("Unknown option: lxc.cgroup2.devices.allow\n400 unable to parse option\n")
    assert update == Result(0, "", "")
    assert conf.read_text() == (
        "cores: 2\nhostname: ct\nmemory: 2048\nunprivileged: 1\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    )


def test_proxmoxer_command_backend_reads_the_stand_in_like_pvesh(
    pve: Pve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """proxmoxer's local backend shares the ssh backend's pvesh handling (command_base.py): UPIDs, leading
    handler output, stderr statuses."""
    from proxmoxer import ProxmoxAPI, ResourceException  # noqa: PLC0415 - only this test needs it
    from proxmoxer.tools import Tasks  # noqa: PLC0415

    wrapper = pve.base / "bin/pvesh"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{PVESH}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:/usr/bin:/bin")
    monkeypatch.setenv("PVEGPU_LAB_PVE_CONFIG", str(pve.base / "pve.json"))
    api = ProxmoxAPI(backend="local", service="PVE")  # type: ignore[no-untyped-call]
    node = api.nodes(NODE)

    upid = node.qemu.post(vmid=100, machine="q35", numa=True)
    status = Tasks.blocking_status(api, upid)  # type: ignore[no-untyped-call]
    update = node.qemu(100).config.put(cores=4)
    with pytest.raises(ResourceException) as stale:
        node.qemu(100).config.put(cores=2, digest="0" * 40)
    with pytest.raises(ResourceException) as listed:
        api.cluster.mapping.pci.post(id="gpu0", map=[GPU0, GPU1])

    assert (status["status"], status["exitstatus"]) == ("stopped", "OK")
    assert update == {"errors": "update VM 100: -cores 4\n"}
    assert (stale.value.status_code, stale.value.content) == (
        500,
        "checksum mismatch (file change by other user?)\n",
    )
    assert (listed.value.status_code, listed.value.content.splitlines()[1]) == (
        400,
        "map[0]: invalid format - invalid key in comma-separated list property: ['path",
    )
    assert node.qemu(100).config.get()["numa"] == 1


def test_lxc_create_takes_ssh_keys_outside_the_config(pve: Pve) -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake op@desk"
    template = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
    created = pve(
        "create", "/nodes/pve1/lxc", "--vmid", "200", "--ostemplate", template, "--ssh-public-keys", key
    )
    match = UPID.fullmatch(created.out.splitlines(keepends=True)[-1])
    assert match is not None, created
    assert match.group(2, 3) == ("vzcreate", "200")
    config = pve.json("get", "/nodes/pve1/lxc/200/config")
    assert "ssh-public-keys" not in config
    assert config["rootfs"] == "local:vm-200-disk-0,size=4G"


def test_drift_killed_create_leaves_the_stub_locked_and_a_task_that_no_longer_runs(pve: Pve) -> None:
    # The worker dies while it writes its task log (past 100 bytes: EFBIG, as on a full disk), after the
    # stub config and before the final one, as a killed `qm create` leaves a real node.
    env = {"PVEGPU_LAB_PVE_CONFIG": str(pve.base / "pve.json"), "PATH": "/usr/bin:/bin"}
    args = ["create", "/nodes/pve1/qemu", *VM_ARGS, *VM_DISKS, "--output-format", "json"]
    killed = subprocess.run(
        [sys.executable, str(PVESH), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100)),
    )
    assert (killed.returncode, killed.stderr.splitlines()[-1]) == (1, "OSError: [Errno 27] File too large")

    assert pve.file("etc/pve/qemu-server/100.conf") == "lock: create\n"
    tasks = pve.json("get", "/nodes/pve1/tasks", "--vmid", "100", "--source", "all")
    assert [(t["type"], t["id"], t["user"], t["status"]) for t in tasks] == [
        ("qmcreate", "100", "root@pam", "unexpected status")
    ]
    status = pve.json("get", f"/nodes/pve1/tasks/{tasks[0]['upid']}/status")
    assert (status["status"], status["exitstatus"]) == ("stopped", "unexpected status")
    assert pve.json("get", "/nodes/pve1/qemu/100/config") == {
        "lock": "create",
        "digest": sha1("lock: create\n"),
    }
    assert pve("set", "/nodes/pve1/qemu/100/config", "--cores", "4") == Result(
        255, "", "VM is locked (create)\n"
    )
    start = pve("create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json")
    assert start.err == "VM is locked (create)\n"

    # `qm unlock 100` (here through the API, root only), then the config is empty; a PUT finishes it the
    # way qemu-server's update does: disks allocated (after the volumes the killed worker left, as
    # find_free_diskname skips them), the NIC given a MAC.
    assert pve("set", "/nodes/pve1/qemu/100/config", "--delete", "lock", "--skiplock", "1").rc == 0
    assert pve.file("etc/pve/qemu-server/100.conf") == ""
    put = pve("set", "/nodes/pve1/qemu/100/config", *VM_DISKS, "--net0", "virtio,bridge=vmbr0")
    assert put.out.splitlines()[1:] == [
        "efidisk0: successfully created disk 'local-lvm:vm-100-disk-2,efitype=4m,size=4M'",
        "scsi0: successfully created disk 'local-lvm:vm-100-disk-3,size=32G'",
    ]
    config = pve.json("get", "/nodes/pve1/qemu/100/config")
    assert (
        config["scsi0"],
        re.sub("[0-9A-F]{2}:[0-9A-F]{2}:[0-9A-F]{2}$", "..", config["net0"].split(",")[0]),
    ) == (
        "local-lvm:vm-100-disk-3,size=32G",
        "virtio=BC:24:11:..",
    )
