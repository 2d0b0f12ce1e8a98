"""VmSpec (host data key `vm`): defaults, Proxmox's formats, and the `path: message` lines operators see."""

from __future__ import annotations

import pytest

from pvegpu.inventory.validate import ROLE_SPECS, validate_inventory
from pvegpu.models.errors import InventoryError
from pvegpu.models.spec_validation import spec_of
from pvegpu.models.vm import VM_KEY, DiskSpec, NetSpec, VmSpec


def problems(data: dict[str, object]) -> str:
    with pytest.raises(InventoryError) as raised:
        spec_of({VM_KEY: data}, VM_KEY, VmSpec)
    return str(raised.value)


def test_defaults() -> None:
    assert spec_of({VM_KEY: {"vmid": 120}}, VM_KEY, VmSpec) == VmSpec(
        vmid=120,
        name="llm",
        machine="q35",
        cores=16,
        memory=65536,
        numa=True,
        hugepages=None,
        disk=DiskSpec(storage="local-lvm", size_gib=200),
        net=NetSpec(model="virtio", bridge="vmbr0"),
        onboot=True,
        mapping_prefix="gpu",
        mmio="args",
    )


@pytest.mark.parametrize("machine", ["q35", "pc-q35-9.2", "pc-q35-9.2+pve1", "pc-q35-8.1.5"])
def test_machine_q35_or_pinned(machine: str) -> None:
    assert VmSpec(vmid=100, machine=machine).machine == machine


def test_registered_and_validated_with_the_inventory() -> None:
    assert ROLE_SPECS[VM_KEY] is VmSpec
    node = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}
    with pytest.raises(InventoryError) as raised:
        validate_inventory([("pve1", {"node": node, VM_KEY: {"vmid": 99}})])
    assert str(raised.value) == "pve1: vm.vmid: must be at least 100 (got 99)"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "vm.vmid: is required"),
        ({"vmid": "100"}, "vm.vmid: must be a whole number (got '100')"),
        (
            {"vmid": 100, "machine": "pc-i440fx-9.2"},
            "vm.machine: 'pc-i440fx-9.2' is not q35 or a pinned pc-q35-X.Y[+pveN] machine",
        ),
        (
            {"vmid": 100, "hugepages": "1024", "numa": False},
            "vm: hugepages need numa: true (Proxmox: numa needs to be enabled to use hugepages)",
        ),
        ({"vmid": 100, "hugepages": 2}, "vm.hugepages: must be one of 2, 1024, any (got 2)"),
        (
            {"vmid": 100, "name": "my_vm"},
            "vm.name: 'my_vm' is not a DNS name (letters, digits, hyphens, dots)",
        ),
        ({"vmid": 100, "memory": 8}, "vm.memory: must be at least 16 (got 8)"),
        ({"vmid": 100, "numa": "yes"}, "vm.numa: must be true or false (got 'yes')"),
        (
            {"vmid": 100, "disk": {"storage": "Local"}},
            "vm.disk.storage: 'Local' is not a Proxmox storage id (e.g. local-lvm)",
        ),
        (
            {"vmid": 100, "net": {"bridge": "vmbr 0"}},
            "vm.net.bridge: 'vmbr 0' is not a Linux bridge name (e.g. vmbr0)",
        ),
        (
            {"vmid": 100, "mapping_prefix": "9g"},
            "vm.mapping_prefix: '9g' is not a mapping id prefix (a letter, then a-z 0-9 _ -)",
        ),
        ({"vmid": 100, "mmio": "bar"}, "vm.mmio: must be one of args, phys-bits (got 'bar')"),
        ({"vmid": 100, "disks": {}}, "vm.disks: unknown field (did you mean 'disk'?)"),
    ],
)
def test_error_field(data: dict[str, object], message: str) -> None:
    assert problems(data) == message
