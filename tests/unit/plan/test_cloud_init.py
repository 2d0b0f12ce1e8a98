"""A VM made from a cloud image: its create keys, its user-data (exact text, and what YAML reads back), the
image volume, the snippet, and the guest's static address."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pvegpu.models.vm import VmSpec
from pvegpu.plan.cloud_init import (
    image_volid,
    made_by_cloud_init,
    snippet_name,
    snippet_volid,
    static_address,
    user_data,
)
from pvegpu.plan.vm import create_keys

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5HcbcUQrpSUxW4nw/rMoAjNHG/aykHEZ6M+9fVDl2P you@desk"
# Comments are free text: YAML syntax in one must stay text in the user-data.
TRICKY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKkxdQojzjRQfF6QLujkv2HcSgBqCWg6RAl8lhzsW7VS "
    "a: b #c &x *y !z {}[]'\""
)
HOST_PRIVATE = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nQyNTUxOQAAACB=\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
HOST_PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAID39RrCr3UqQPKrU85KFYRy+sXn13WqT3rvJImSRb+qv"
LOGIN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGqX0n1bBvJ8yPkfRLq3gF2pE3h3kK3j2yQO6G0VvQ6b"
URL = "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"


def spec(**fields: Any) -> VmSpec:
    return VmSpec.model_validate({"vmid": 120, "ssh_public_keys": [KEY], **fields})


def test_create_keys_without_an_image_allocate_an_empty_disk() -> None:
    assert create_keys(VmSpec(vmid=120)) == {
        "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=0",
        "scsi0": "local-lvm:200,iothread=1",
        "net0": "virtio,bridge=vmbr0",
    }


def test_create_keys_from_an_image_volume() -> None:
    vm = spec(image={"volume": "local:import/debian-12.qcow2"}, disk={"storage": "fast", "size_gib": 64})
    assert create_keys(vm) == {
        "efidisk0": "fast:1,efitype=4m,pre-enrolled-keys=0",
        "scsi0": "fast:0,import-from=local:import/debian-12.qcow2,iothread=1",
        "net0": "virtio,bridge=vmbr0",
        "boot": "order=scsi0",
        "ide2": "fast:cloudinit",
        "ipconfig0": "ip=dhcp",
        "ciupgrade": "0",
        "cicustom": "user=local:snippets/pvegpu-120-user.yaml",
    }


def test_create_keys_from_a_downloaded_image_with_a_static_address() -> None:
    vm = spec(
        image={"url": URL, "checksum": "ab" * 64, "storage": "images"},
        ipconfig="ip=10.0.0.5/24,gw=10.0.0.1",
        snippets_storage="snips",
    )
    keys = create_keys(vm)
    assert (
        keys["scsi0"] == "local-lvm:0,import-from=images:import/debian-12-genericcloud-amd64.qcow2,iothread=1"
    )
    assert keys["ipconfig0"] == "ip=10.0.0.5/24,gw=10.0.0.1"
    assert keys["cicustom"] == "user=snips:snippets/pvegpu-120-user.yaml"


def test_image_volid() -> None:
    assert image_volid(spec(image={"volume": "local:import/a.raw"})) == "local:import/a.raw"
    assert image_volid(spec(image={"url": URL, "checksum": "ab" * 64})) == (
        "local:import/debian-12-genericcloud-amd64.qcow2"
    )
    ubuntu = {
        "url": "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img",
        "checksum": "ab" * 32,
        "checksum_algorithm": "sha256",
        "file_name": "noble.qcow2",
    }
    assert image_volid(spec(image=ubuntu)) == "local:import/noble.qcow2"
    with pytest.raises(ValueError, match=r"^VM 120 has no vm.image$"):
        image_volid(VmSpec(vmid=120))


def test_snippet() -> None:
    assert snippet_name(120) == "pvegpu-120-user.yaml"
    assert snippet_volid(spec(snippets_storage="snips")) == "snips:snippets/pvegpu-120-user.yaml"


def test_user_data_for_root() -> None:
    text = user_data(spec(image={"volume": "local:import/a.qcow2"}), HOST_PRIVATE, HOST_PUBLIC, LOGIN)
    assert text == (
        "#cloud-config\n"
        "hostname: llm\n"
        "disable_root: false\n"
        "users:\n"
        "- name: root\n"
        "  ssh_authorized_keys:\n"
        f"  - {LOGIN}\n"
        f"  - {KEY}\n"
        "ssh_keys:\n"
        "  ed25519_private: |\n"
        "    -----BEGIN OPENSSH PRIVATE KEY-----\n"
        "    b3BlbnNzaC1rZXktdjEAAAAA\n"
        "    QyNTUxOQAAACB=\n"
        "    -----END OPENSSH PRIVATE KEY-----\n"
        f"  ed25519_public: {HOST_PUBLIC}\n"
        "ssh_deletekeys: true\n"
        "ssh_genkeytypes: []\n"
        "packages:\n"
        "- qemu-guest-agent\n"
        "runcmd:\n"
        "- - systemctl\n"
        "  - enable\n"
        "  - --now\n"
        "  - qemu-guest-agent\n"
    )


def test_user_data_for_another_user_reads_back_as_intended() -> None:
    vm = spec(
        image={"volume": "local:import/a.qcow2"}, user="debian", ssh_public_keys=[KEY, TRICKY], name="gpu1"
    )
    text = user_data(vm, HOST_PRIVATE, HOST_PUBLIC, LOGIN)
    assert text.startswith("#cloud-config\n")
    assert yaml.safe_load(text) == {
        "hostname": "gpu1",
        "users": [
            {
                "name": "debian",
                "ssh_authorized_keys": [LOGIN, KEY, TRICKY],
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "shell": "/bin/bash",
                "lock_passwd": True,
            }
        ],
        "ssh_keys": {"ed25519_private": HOST_PRIVATE, "ed25519_public": HOST_PUBLIC},
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "packages": ["qemu-guest-agent"],
        "runcmd": [["systemctl", "enable", "--now", "qemu-guest-agent"]],
    }


@pytest.mark.parametrize(
    ("ipconfig", "address"),
    [
        ("ip=dhcp", None),
        ("ip6=auto", None),
        ("ip=dhcp,ip6=dhcp", None),
        ("ip=10.0.0.5/24,gw=10.0.0.1", "10.0.0.5"),
        ("ip=10.0.0.5/24,ip6=fd00::5/64", "10.0.0.5"),
        ("ip=dhcp,ip6=fd00::5/64,gw6=fd00::1", "fd00::5"),
        ("ip6=FD00:0::5/64", "fd00::5"),
    ],
)
def test_static_address(ipconfig: str, address: str | None) -> None:
    assert static_address(ipconfig) == address


@pytest.mark.parametrize(
    ("cicustom", "made"),
    [
        ("user=local:snippets/pvegpu-120-user.yaml", True),
        ("vendor=local:snippets/v.yaml,user=local:snippets/pvegpu-120-user.yaml", True),
        ("user=local:snippets/someone-else.yaml", False),
        (None, False),
    ],
)
def test_a_vm_is_pvegpus_cloud_init_vm_only_with_its_user_data(cicustom: str | None, made: bool) -> None:
    values = {} if cicustom is None else {"cicustom": cicustom}
    assert made_by_cloud_init(values, spec(image={"volume": "local:import/a.qcow2"})) is made
