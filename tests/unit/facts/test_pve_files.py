"""pvegpu/facts/pve_files.py: the API's answers computed from Proxmox's config files.

Where the answer is modelled it equals the lab's pvesh stand-in's (lab/pve/pvesh.py, which follows
shared/knowledge/proxmox-api-behaviour.md) for the same file: the lab node's VM config and storage.cfg, and
the VM configs of qemu-server's own regression tests (shared/fixtures/real/20_...). Where it is not (what
qemu-server's parse_vm_config and pve-storage's parse_config treat in ways not modelled), it is None, so
the API is asked.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab import fakesys
from pvegpu.facts.hardware_parse import read_hardware_locally
from pvegpu.facts.pve_files import MASKED, mappings_answer, qemu_config_answer, storage_answer
from pvegpu.models.hardware import HostHardware
from tests.unit.realdata import real_fixture

PVESH = Path(__file__).resolve().parents[3] / "lab/pve/pvesh.py"
REAL = "20_proxmox_qemu_server_hostpci_vm_configs_and_kvm_cmdlines.txt"
REAL_CONFIGS = (
    "q35-linux-hostpci.conf",
    "q35-linux-hostpci-multifunction.conf",
    "q35-linux-hostpci-mapping.conf",
    "q35-linux-hostpci-x-pci-overrides.conf",
    "q35-win10-hostpci.conf",
    "i440fx-win10-hostpci.conf",
)
LAB_CONF = b"""affinity: 1-31,33-127
agent: 1
args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=4194304
balloon: 0
bios: ovmf
boot: order=scsi0
cicustom: user=local:snippets/pvegpu-100-user.yaml
ciupgrade: 0
cores: 2
cpu: host
efidisk0: local-lvm:vm-100-disk-0,efitype=4m,pre-enrolled-keys=0,size=4M
hookscript: local:snippets/pvegpu-hook
hostpci0: mapping=gpu0,pcie=1
hostpci1: mapping=gpu1,pcie=1
ide2: local-lvm:vm-100-cloudinit,media=cdrom
ipconfig0: ip=10.200.101.2/24,gw=10.200.101.1
machine: q35
memory: 8192
meta: creation-qemu=9.0.3,ctime=1796170639
name: nodev100
net0: virtio=BC:24:11:49:0A:D4,bridge=vmbr0
numa: 1
numa0: cpus=0-1,hostnodes=0,memory=4096,policy=bind
onboot: 1
ostype: l26
scsi0: local-lvm:vm-100-disk-1,iothread=1,size=32G
scsihw: virtio-scsi-single
smbios1: uuid=c02479e9-28bb-4459-8206-bc1915b7debe
sockets: 2
vmgenid: fc63a996-0695-42fd-8296-4d498f3c85fb
"""  # captured from the lab node's /etc/pve/qemu-server/100.conf (two GPUs kept)
LAB_STORAGE = b"""dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup,import,snippets

lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images
"""


def _real_config(name: str) -> bytes:
    """One VM config of the capture (its blocks are `#### FILE: <path>` and the file's lines)."""
    blocks = re.split(r"^#### FILE: (\S+)\n", real_fixture(REAL).read_text(), flags=re.MULTILINE)
    (body,) = [
        body for path, body in zip(blocks[1::2], blocks[2::2], strict=True) if path.endswith(f"/{name}")
    ]
    return body.encode()


def _standin(tmp_path: Path, args: list[str], files: dict[str, bytes], sysfs: Path | None = None) -> object:
    """The stand-in's `pvesh get ARGS` JSON with `files` in its root (its sysfs: `sysfs`, else the reference
    tree)."""
    root = tmp_path / "root"
    if sysfs is None:
        sysfs = tmp_path / "sys"
        fakesys.write_tree(sysfs, "reference")
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    settings = {"node": "pve1", "sysfs_root": str(sysfs), "root": str(root)}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    env = {"PVEGPU_LAB_PVE_CONFIG": str(tmp_path / "pve.json"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(PVESH), "get", *args, "--output-format", "json"],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", ["lab", *REAL_CONFIGS])
def test_vm_config_is_the_apis(tmp_path: Path, name: str) -> None:
    conf = LAB_CONF if name == "lab" else _real_config(name)
    answer = qemu_config_answer(conf)
    assert answer is not None
    assert answer == _standin(
        tmp_path, ["/nodes/pve1/qemu/100/config"], {"etc/pve/qemu-server/100.conf": conf}
    )


def test_vm_config_types_description_and_digest() -> None:
    conf = (
        b"#first line %C3%A9t%C3%A9\n#\n# second line  \nonboot: yes\ntablet: off\ncores: +4\n"
        b"cipassword: $5$hash\nlock: backup\ndelete: cores\nnot a config line\n\n[snap1]\ncores: 9\n"
    )
    assert qemu_config_answer(conf) == {
        "description": "first line \u00e9t\u00e9\n\n second line",
        "onboot": 1,
        "tablet": 0,
        "cores": 4,
        "cipassword": MASKED,
        "lock": "backup",
        "digest": hashlib.sha1(conf).hexdigest(),
    }
    assert qemu_config_answer(b"description: a%20b\ncores: 1\n") == {
        "description": "a b",
        "cores": 1,
        "digest": hashlib.sha1(b"description: a%20b\ncores: 1\n").hexdigest(),
    }


@pytest.mark.parametrize(
    "conf",
    [
        b"cores: 2\n\n[PENDING]\ncores: 4\n",  # the API applies pending changes
        b"cores: 2\n[pending]\ndelete: cores\n",
        b"cores: two\n",  # a value its type refuses: Proxmox drops it
        b"onboot: maybe\n",
        b"cpulimit: 0.5\n",  # a number: not modelled
        b"cdrom: local:iso/d.iso,media=cdrom\n",  # Proxmox gives it as ide2
        b"snapstate: prepare\n",
        b"frobnicate: 1\n",  # not in the schema: Proxmox drops it
        b"hostpci16: mapping=gpu16\n",  # beyond the schema's indexes
        b"scsi0: /dev/sdb,size=32G\n",  # a path: Proxmox gives its volume id
        b"name: \xff\n",
    ],
)
def test_vm_config_not_modelled_is_none(conf: bytes) -> None:
    assert qemu_config_answer(conf) is None


def test_storage_is_the_apis(tmp_path: Path) -> None:
    answer = storage_answer(LAB_STORAGE, "local")
    assert answer == _standin(tmp_path, ["/storage/local"], {"etc/pve/storage.cfg": LAB_STORAGE})
    assert answer == {
        "storage": "local",
        "type": "dir",
        "path": "/var/lib/vz",
        "content": "iso,vztmpl,backup,import,snippets",
        "digest": hashlib.sha1(LAB_STORAGE).hexdigest(),
    }


def test_storage_sections_as_sectionconfig_reads_them() -> None:
    cfg = (
        b"# a comment\ndir: images\n\tpath /srv/images\n# inside\n\tcontent images,import\n\tcontent iso\n"
        b"\nx\n  \tbad line\ndir: bad.id.\n\tpath /x\n\tcontent iso\n"
    )
    answer = storage_answer(cfg, "images")
    assert answer is not None
    assert (answer["path"], answer["content"]) == ("/srv/images", "images,import")  # the first value kept
    assert storage_answer(cfg, "bad.id.") is None  # an invalid id: Proxmox skips the section


def test_a_repeated_key_keeps_its_first_value_in_pvegpu_and_the_stand_in(tmp_path: Path) -> None:
    # pve-common SectionConfig.pm parse_config: `die "duplicate attribute\n" if defined($config->{$k})`
    cfg = (
        LAB_STORAGE
        + b"\ndir: images\n\tpath /srv/images\n\tpath /srv/other\n\tcontent import\n\tcontent iso\n"
    )
    answer = storage_answer(cfg, "images")
    assert answer == _standin(tmp_path, ["/storage/images"], {"etc/pve/storage.cfg": cfg})
    assert answer is not None
    assert (answer["path"], answer["content"]) == ("/srv/images", "import")


@pytest.mark.parametrize(
    ("cfg", "storage"),
    [
        (LAB_STORAGE, "nfs1"),  # not in the file
        (LAB_STORAGE, "local-lvm"),  # not a dir storage
        (b"lvmthin: local-lvm\n\tvgname pve\n\tcontent images\n", "local"),  # Proxmox supplies `local`
        (b"dir: local\n\tpath /srv/vz\n\tcontent iso\n", "local"),  # ...and replaces this one
        (b"dir: data\n\tpath /srv\n", "data"),  # no content: the plugin's default
        (b"dir: data\n\tpath /srv\n\tcontent iso,bogus\n", "data"),  # Proxmox drops `bogus`
        (b"dir: data\n\tpath /srv\n\tcontent none\n", "data"),
        (b"dir: data\n\tpath /srv\n\tcontent iso\n\tnodes pve1\n", "data"),
        (b"dir: data\n\tcontent iso\n", "data"),  # no path
    ],
)
def test_storage_not_modelled_is_none(cfg: bytes, storage: str) -> None:
    assert storage_answer(cfg, storage) is None


def _pci_cfg(entries: dict[str, list[str]], extra: str = "") -> bytes:
    return "".join(
        f"{mapping}\n{extra}" + "".join(f"\tmap {line}\n" for line in lines) + "\n"
        for mapping, lines in entries.items()
    ).encode()


def _map_line(manifest: dict[str, Any], index: int, node: str = "pve1", group: int | None = None) -> str:
    gpu = manifest["gpus"][index]
    device = manifest["devices"][gpu["functions"][0]]
    return (
        f"id={device['vendor']}:{device['device']},node={node},path={gpu['address']},"
        f"iommugroup={gpu['iommu_group'] if group is None else group},"
        f"subsystem-id={device['subsystem_vendor']}:{device['subsystem_device']}"
    )


@pytest.fixture(scope="module")
def vfio_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], HostHardware]:
    sysfs = tmp_path_factory.mktemp("vfio") / "sys"
    manifest = fakesys.write_tree(sysfs, "reference", driver="vfio-pci")
    return sysfs, manifest, read_hardware_locally(sysfs)


def test_mappings_are_the_apis_with_the_nodes_checks(
    tmp_path: Path, vfio_tree: tuple[Path, dict[str, Any], HostHardware]
) -> None:
    """Valid on the node (no check), a mapping of another node only (the warning), description and flags."""
    sysfs, manifest, hardware = vfio_tree
    cfg = _pci_cfg({"gpu0": [_map_line(manifest, 0), _map_line(manifest, 0, node="pve2")]}) + _pci_cfg(
        {"gpu1": [_map_line(manifest, 1, node="pve2")]},
        extra="\tdescription GPU 1\n\tlive-migration-capable 0\n",
    )
    answer = mappings_answer(cfg, "pve1", hardware)
    args = ["/cluster/mapping/pci", "--check-node", "pve1"]
    assert answer == _standin(tmp_path, args, {"etc/pve/mapping/pci.cfg": cfg}, sysfs=sysfs)
    assert answer is not None
    assert [(item["id"], item["checks"]) for item in answer] == [
        ("gpu0", []),
        ("gpu1", [{"severity": "warning", "message": "No mapping for node pve1."}]),
    ]


def test_mappings_not_proven_are_none(
    tmp_path: Path, vfio_tree: tuple[Path, dict[str, Any], HostHardware]
) -> None:
    _, manifest, hardware = vfio_tree
    stale = _map_line(manifest, 0, group=99)  # Proxmox's check fails: its message is wanted
    assert mappings_answer(_pci_cfg({"gpu0": [stale]}), "pve1", hardware) is None
    assert (
        mappings_answer(_pci_cfg({"gpu0": [_map_line(manifest, 0)]}, "\tmdev 1\n"), "pve1", hardware) is None
    )
    moved = _map_line(manifest, 0).replace(manifest["gpus"][0]["address"], "0000:09:00")
    assert mappings_answer(_pci_cfg({"gpu0": [moved]}), "pve1", hardware) is None
    fakesys.write_tree(tmp_path / "nvidia", "reference", driver="nvidia")
    nvidia = read_hardware_locally(tmp_path / "nvidia")  # on nvidia its mdev types are not read
    assert mappings_answer(_pci_cfg({"gpu0": [_map_line(manifest, 0)]}), "pve1", nvidia) is None
    assert mappings_answer(b"\xff", "pve1", hardware) is None
