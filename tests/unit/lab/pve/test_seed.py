"""lab.pve.seed: the installed i440FX/SeaBIOS VM's conf, as qemu-server writes it (keys sorted)."""

from __future__ import annotations

from lab.pve.seed import mac_of, seed_conf


def test_seed_conf_is_a_gui_made_linux_vm_with_conventional_pci_gpus() -> None:
    assert mac_of("pve1", 100) == "BC:24:11:C7:9A:86"
    assert seed_conf("pve1", 100, 2) == (
        "agent: 1\n"
        "boot: order=scsi0;net0\n"
        "cores: 4\n"
        "cpu: host\n"
        "hostpci0: mapping=gpu0\n"
        "hostpci1: mapping=gpu1\n"
        "memory: 8192\n"
        "meta: creation-qemu=8.1.5,ctime=1700000000\n"
        "name: llm\n"
        "net0: virtio=BC:24:11:C7:9A:86,bridge=vmbr0,firewall=1\n"
        "numa: 0\n"
        "ostype: l26\n"
        "scsi0: local-lvm:vm-100-disk-0,iothread=1,size=32G\n"
        "scsihw: virtio-scsi-single\n"
        "smbios1: uuid=5a4ae6c7-3ef0-5520-9762-38947fb1a709\n"
        "sockets: 1\n"
        "vmgenid: e9a28224-570d-5b69-835f-4b091bbda222\n"
    )
