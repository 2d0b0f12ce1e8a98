"""`q35_conversion`: an installed i440FX/SeaBIOS VM's config and its guest agent's answers in -> the exact
commands and API calls out (when executed), the noop sentence, or the refusal. Agent answers follow
qemu-server's PVE::API2::Qemu::Agent (`{"result": ...}`; file-read `{"content", "bytes-read"}`; file-write
null)."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.models.vm import VmSpec
from pvegpu.operations import pve_guest
from pvegpu.operations.convert import q35_conversion
from pvegpu.plan.vm import VmPlan, create_keys, vm_config
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import ConfigStore, FakeApi, execute, sequence, task_ok
from tests.unit.op_harness import run_op

SPEC = VmSpec(vmid=120, cores=16, memory=65536)
CONFIG = vm_config(SPEC, ("gpu0", "gpu1"), None)
PLAN = VmPlan(SPEC, CONFIG, create_keys(SPEC), clique="", storages={}, unbound=(), problem=None)
DIGEST = "3f786850e387550fdab836ed7e6dc881de23001b"
VM = "/nodes/pve1/qemu/120"
MAC = "BC:24:11:5E:2A:01"
SEEDED: dict[str, object] = {
    "name": "llm",
    "ostype": "l26",
    "cores": 16,
    "memory": "65536",
    "scsihw": "virtio-scsi-single",
    "scsi0": "local-lvm:vm-120-disk-0,iothread=1,size=32G",
    "net0": f"virtio={MAC},bridge=vmbr0",
    "hostpci0": "mapping=gpu0",
    "hostpci1": "mapping=gpu1",
    "agent": "1",
    "digest": DIGEST,
}
FSINFO = {
    "result": [
        {"name": "sda15", "mountpoint": "/boot/efi", "type": "vfat", "disk": []},
        {"name": "sda1", "mountpoint": "/", "type": "ext4", "disk": []},
    ]
}
NICS = {
    "result": [
        {"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": []},
        {"name": "ens18", "hardware-address": MAC.lower(), "ip-addresses": []},
    ]
}
UPID_SHUTDOWN = "UPID:pve1:0000A1B4:0153F2C4:66A1B2C5:qmshutdown:120:root@pam:"
LINK = "/etc/systemd/network/10-pvegpu-net0.link"


def status(state: str) -> dict[str, object]:
    return {"vmid": 120, "status": state, "qmpstatus": state, "name": "llm"}


class Guest:
    """The guest's files as the agent reads and writes them."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = dict(files)

    def read(self, params: dict[str, Any]) -> dict[str, object]:
        path = params["file"]
        if path not in self.files:
            raise PveError(500, f"Agent error: failed to open file '{path}' (mode: 'r'): No such file")
        return {"content": self.files[path], "bytes-read": len(self.files[path])}

    def write(self, params: dict[str, Any]) -> None:
        self.files[params["file"]] = params["content"]


def api_of(store: ConfigStore, guest: Guest, state: object) -> FakeApi:
    return FakeApi(
        {
            ("GET", f"{VM}/config"): store.get,
            ("PUT", f"{VM}/config"): store.put,
            ("GET", f"{VM}/status/current"): state,
            ("GET", f"{VM}/agent/get-fsinfo"): FSINFO,
            ("GET", f"{VM}/agent/network-get-interfaces"): NICS,
            ("GET", f"{VM}/agent/file-read"): guest.read,
            ("POST", f"{VM}/agent/file-write"): guest.write,
            ("POST", f"{VM}/status/shutdown"): UPID_SHUTDOWN,
            ("GET", f"/nodes/pve1/tasks/{UPID_SHUTDOWN}/status"): task_ok(UPID_SHUTDOWN),
        }
    )


def convert(api: FakeApi) -> tuple[list[Any], list[str]]:
    return run_op(
        q35_conversion,
        {},
        guest=pve_guest.Guest(pve_guest.VM, api.client, "pve1", 120),
        vm=PLAN,
        timeout_s=5,
    )


def store(values: dict[str, object]) -> ConfigStore:
    return ConfigStore(values, missing=PveError(500, "unused"), mismatch="checksum mismatch")


BOOTABLE = {
    "/etc/os-release": "ID=debian\n",
    "/boot/efi/EFI/BOOT/BOOTX64.EFI": "MZ shim",
    "/boot/efi/EFI/debian/grubx64.efi": "MZ grub",
}


def test_convert_pins_the_nic_keeps_the_config_shuts_down_and_sets_q35_ovmf() -> None:
    config, guest = store(SEEDED), Guest(BOOTABLE)
    api = api_of(config, guest, sequence(status("running"), status("stopped")))

    commands, noops = convert(api)
    backup = commands[1]
    execute([commands[0], *commands[2:]])

    assert noops == []
    assert backup == (
        f"install -d -m 0700 /var/lib/pvegpu/backup && cp /etc/pve/qemu-server/120.conf "
        f"/var/lib/pvegpu/backup/120.conf.{DIGEST}.partial && {{ echo '{DIGEST}  /var/lib/pvegpu/backup/"
        f"120.conf.{DIGEST}.partial' | sha1sum --check --quiet || {{ rm -f /var/lib/pvegpu/backup/120.conf."
        f"{DIGEST}.partial; exit 1; }}; }} && mv /var/lib/pvegpu/backup/120.conf.{DIGEST}.partial "
        f"/var/lib/pvegpu/backup/120.conf.{DIGEST}"
    )
    assert guest.files[LINK].endswith("[Match]\nMACAddress=bc:24:11:5e:2a:01\n\n[Link]\nName=ens18\n")
    writes = api.writes()
    assert writes[:2] == [
        ("POST", f"{VM}/agent/file-write", {"file": LINK, "content": guest.files[LINK]}),
        ("POST", f"{VM}/status/shutdown", {"timeout": 5}),
    ]
    method, path, sent = writes[2]
    assert (method, path, sent["digest"]) == ("PUT", f"{VM}/config", DIGEST)
    assert {key: sent[key] for key in ("machine", "bios", "efidisk0", "hostpci0", "hostpci1")} == {
        "machine": "q35",
        "bios": "ovmf",
        "efidisk0": "local-lvm:1,efitype=4m,pre-enrolled-keys=0",
        "hostpci0": "mapping=gpu0,pcie=1",
        "hostpci1": "mapping=gpu1,pcie=1",
    }
    assert len(writes) == 3


def test_noop_q35_ovmf_vm() -> None:
    values = {**SEEDED, "machine": "q35", "bios": "ovmf"}
    commands, noops = convert(api_of(store(values), Guest({}), status("running")))

    assert (commands, noops) == ([], ["VM 120 on pve1 is Q35/OVMF: nothing to convert"])


def test_error_loader_missing_is_refused_and_nothing_written() -> None:
    guest = Guest({"/etc/os-release": "ID=debian\n", "/boot/efi/EFI/debian/grubx64.efi": "MZ grub"})
    api = api_of(store(SEEDED), guest, status("running"))

    with pytest.raises(OperationError) as refused:
        convert(api)

    assert str(refused.value).startswith(
        "VM 120 (machine pc, bios seabios) is not converted to Q35/OVMF: its EFI system partition (sda15 at "
        "/boot/efi) lacks /boot/efi/EFI/BOOT/BOOTX64.EFI"
    )
    assert api.writes() == []


def test_error_agent_not_running_is_refused() -> None:
    api = api_of(store(SEEDED), Guest({}), status("running"))
    api.answers[("GET", f"{VM}/agent/get-fsinfo")] = PveError(500, "QEMU guest agent is not running")

    with pytest.raises(OperationError) as refused:
        convert(api)

    assert str(refused.value).startswith(
        "VM 120 (machine pc, bios seabios) is not converted to Q35/OVMF: its guest agent does not answer "
        f"(GET {VM}/agent/get-fsinfo: QEMU guest agent is not running); nothing changed."
    )
    assert api.writes() == []


def test_error_config_changed_after_the_check_is_not_overwritten() -> None:
    config = store(SEEDED)
    api = api_of(config, Guest(BOOTABLE), sequence(status("running"), status("stopped")))
    commands, _ = convert(api)
    config.values = {**SEEDED, "cores": 8, "digest": "0" * 40}  # someone else, after pvegpu's check

    with pytest.raises(OperationError) as refused:
        execute([commands[0], *commands[2:]])

    assert str(refused.value) == (
        "VM 120 not converted: its config changed since it was checked; it is stopped: start it (`qm start "
        "120`), then run again"
    )
    assert [call[:2] for call in api.writes()] == [
        ("POST", f"{VM}/agent/file-write"),
        ("POST", f"{VM}/status/shutdown"),
    ]


def test_error_put_refused_leaves_the_vm_stopped_and_says_so() -> None:
    api = api_of(store(SEEDED), Guest(BOOTABLE), sequence(status("running"), status("stopped")))
    api.answers[("PUT", f"{VM}/config")] = PveError(
        400, "Parameter verification failed.", {"hookscript": "script 'local:snippets/x' does not exist"}
    )
    commands, _ = convert(api)

    with pytest.raises(OperationError) as refused:
        execute([commands[0], *commands[2:]])

    assert str(refused.value) == (
        f"VM 120 not converted (PUT {VM}/config: Parameter verification failed.; hookscript: script "
        "'local:snippets/x' does not exist); it is stopped: start it (`qm start 120`), then run again"
    )
