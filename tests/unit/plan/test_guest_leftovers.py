"""`unfinished`: the marks of a create that never finished, in guest configs as Proxmox stores them
(allocated forms from proxmox-api-behaviour.md §4.2 / §6.1; the unfinished ones are the create's own
`<storage>:<GiB>` values)."""

from __future__ import annotations

import pytest

from pvegpu.plan.guest_leftovers import unfinished


@pytest.mark.parametrize(
    ("values", "marks"),
    [
        (
            {
                "scsi0": "local-lvm:vm-100-disk-1,iothread=1,size=32G",
                "efidisk0": "local-lvm:vm-100-disk-0,efitype=4m,size=4M",
                "net0": "virtio=BC:24:11:3F:00:12,bridge=vmbr0",
                "ide2": "local-lvm:cloudinit,media=cdrom",
                "cores": 16,
            },
            (),
        ),
        (
            {"scsi0": "local-lvm:32", "net0": "virtio,bridge=vmbr0", "cores": 16},
            ("net0 virtio,bridge=vmbr0 has no MAC address", "scsi0 local-lvm:32 was never allocated"),
        ),
        (
            {
                "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=0",
                "scsi0": "local-lvm:0,import-from=/x.img",
            },
            (
                "efidisk0 local-lvm:1,efitype=4m,pre-enrolled-keys=0 was never allocated",
                "scsi0 local-lvm:0,import-from=/x.img was never allocated",
            ),
        ),
        (
            {"rootfs": "local-lvm:8", "net0": "name=eth0,bridge=vmbr0,ip=dhcp"},
            (
                "net0 name=eth0,bridge=vmbr0,ip=dhcp has no MAC address",
                "rootfs local-lvm:8 was never allocated",
            ),
        ),
        (
            {
                "rootfs": "local-lvm:vm-200-disk-0,size=8G",
                "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01",
            },
            (),
        ),
        ({}, ("its config is empty",)),
    ],
    ids=["created-vm", "half-made-vm", "unallocated-efi-and-import", "half-made-ct", "created-ct", "empty"],
)
def test_unfinished(values: dict[str, object], marks: tuple[str, ...]) -> None:
    assert unfinished(values) == marks
