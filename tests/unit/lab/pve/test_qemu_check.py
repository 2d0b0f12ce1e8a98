"""Real QEMU's verdict on a lab VM start (lab/pve/qemu_check.py, Debian's qemu-system-x86_64 with `-S`): the
reference VM starts; the multifunction clique form of `args` is refused with QEMU's own message, the
single-function form starts; vfio-pci's property checks (name, range) and its clique rule (NVIDIA, display
class); every `cpu` and `args` form pvegpu writes; the lab's replacements, exactly; what the hypervisor
answers (a virtiofsN's directory is the node's) and what the stand-in's start task logs."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from lab.hosts import LabHost
from lab.pve import hypervisor
from lab.pve.qemu_check import host_phys_bits, lab_run, verdict
from lab.pve.qemu_cmdline import HostPci
from pvegpu.plan.p2p import clique_args
from tests.unit.lab.pve.test_pvesh_cloudimage import Hypervisor, Pve
from tests.unit.lab.pve.test_virtiofsd import CONF as VIRTIOFS_CONF
from tests.unit.lab.pve.test_virtiofsd import REFUSED as VIRTIOFS_REFUSED

BUSES = ("41", "61", "71", "81", "a1", "c1", "d1", "e1")
NV, DISPLAY, AUDIO = "0x10de", "0x030000", "0x040300"
BASE = {
    "machine": "q35",
    "bios": "ovmf",
    "ostype": "l26",
    "cpu": "host",
    "sockets": "1",
    "cores": "32",
    "memory": "393216",
    "numa": "0",
    "efidisk0": "local-lvm:vm-100-disk-0,efitype=4m,pre-enrolled-keys=0,size=4M",
}
REFERENCE = BASE | {f"hostpci{i}": f"mapping=pvegpu-gpu{i},pcie=1" for i in range(8)}
MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576"


def _gpu(index: int, functions: int = 2) -> HostPci:
    names = [f"0000:{BUSES[index]}:00.{f}" for f in range(functions)]
    return HostPci(
        index, tuple(names), dict.fromkeys(names, NV), dict(zip(names, (DISPLAY, AUDIO), strict=False))
    )


MULTIFUNCTION = [_gpu(i) for i in range(8)]
SINGLE = [_gpu(i, functions=1) for i in range(8)]
CLIQUE = " ".join(f"-set device.hostpci{i}.x-nv-gpudirect-clique=0" for i in range(8))


def _device(index: int) -> str:
    return f"vfio-pci,host=0000:{BUSES[index]}:00.0,id=hostpci{index},bus=ich9-pcie-port-{index + 1},addr=0x0"


def test_reference_vm_with_the_mmio_window_starts() -> None:
    assert verdict(100, REFERENCE | {"args": MMIO}, MULTIFUNCTION) is None


def test_error_multifunction_clique_form_is_refused_with_qemus_message() -> None:
    conf = REFERENCE | {"args": f"{MMIO} -set device.hostpci0.0.x-nv-gpudirect-clique=0"}

    assert verdict(100, conf, MULTIFUNCTION) == [
        'kvm: -set device.hostpci0.0.x-nv-gpudirect-clique=0: there is no device "hostpci0" defined'
    ]


def test_single_function_clique_form_starts() -> None:
    assert verdict(100, REFERENCE | {"args": f"{MMIO} {CLIQUE}"}, SINGLE) is None


def test_pvegpus_clique_parts_start_on_single_function_gpus() -> None:
    args = clique_args(((0, 1, 2, 3), (4, 5, 6, 7)))

    assert args.count("-set device.hostpci") == 8
    assert verdict(100, REFERENCE | {"args": f"{MMIO} {args}"}, SINGLE) is None


def test_error_single_function_form_on_a_multifunction_slot_is_refused() -> None:
    conf = REFERENCE | {"args": "-set device.hostpci3.x-nv-gpudirect-clique=1"}

    assert verdict(100, conf, MULTIFUNCTION) == [
        'kvm: -set device.hostpci3.x-nv-gpudirect-clique=1: there is no device "hostpci3" defined'
    ]


@pytest.mark.parametrize(
    ("assignment", "error"),
    [
        pytest.param(
            "x-nv-gpudirect-clique=16", "Property x-nv-gpudirect-clique: valid range 0-15", id="range"
        ),
        pytest.param(
            "x-nv-gpudirect-clique=a", "Parameter 'x-nv-gpudirect-clique' expects integer", id="number"
        ),
        pytest.param(
            "x-nv-gpudirect-cliqe=1", "Property 'vfio-pci.x-nv-gpudirect-cliqe' not found", id="name"
        ),
        pytest.param(
            "0.x-nv-gpudirect-clique=1", "Property 'vfio-pci.0.x-nv-gpudirect-clique' not found", id="dot"
        ),
    ],
)
def test_error_vfio_pci_checks_the_property_it_is_set(assignment: str, error: str) -> None:
    conf = REFERENCE | {"args": f"-set device.hostpci5.{assignment}"}

    assert verdict(100, conf, SINGLE) == [f"kvm: -device {_device(5)}: {error}"]


@pytest.mark.parametrize(
    ("vendor", "class_code", "error"),
    [
        pytest.param("0x1002", DISPLAY, "invalid device vendor", id="not-nvidia"),
        pytest.param(NV, AUDIO, "unsupported PCI class", id="audio-function"),
    ],
)
def test_error_clique_on_what_is_not_an_nvidia_display_function(
    vendor: str, class_code: str, error: str
) -> None:
    gpu = HostPci(0, ("0000:41:00.0",), {"0000:41:00.0": vendor}, {"0000:41:00.0": class_code})
    conf = BASE | {"hostpci0": "mapping=gpu,pcie=1", "args": "-set device.hostpci0.x-nv-gpudirect-clique=2"}

    assert verdict(100, conf, [gpu]) == [
        f"kvm: -device {_device(0)}: vfio 0000:41:00.0: NVIDIA GPUDirect Clique ID: {error}"
    ]


# pvegpu's `cpu` forms (pvegpu/plan/vm.py, pvegpu/plan/mmio.py) and an operator's hidden=1.
@pytest.mark.parametrize(
    "cpu",
    [
        "host",
        "host,guest-phys-bits=40",
        "host,phys-bits=46",
        "host,hidden=1",
        "host,phys-bits=host",
        "host,flags=+pdpe1gb;-aes",
    ],
)
def test_cpu_forms_pvegpu_writes_start(cpu: str) -> None:
    assert verdict(100, REFERENCE | {"cpu": cpu}, MULTIFUNCTION, phys_bits=48) is None


@pytest.mark.parametrize(
    ("cpu", "error"),
    [
        pytest.param(
            "host,guest-phys-bits=49", "guest-phys-bits should be between 32 and 48  (but is 49)", id="guest"
        ),
        pytest.param(
            "host,guest-phys-bits=31", "guest-phys-bits should be between 32 and 48  (but is 31)", id="low"
        ),
        pytest.param(
            "host,phys-bits=70", "phys-bits should be between 32 and 52  (but is 70)", id="phys-bits"
        ),
    ],
)
def test_error_cpu_values_qemu_refuses(cpu: str, error: str) -> None:
    assert verdict(100, REFERENCE | {"cpu": cpu}, MULTIFUNCTION, phys_bits=48) == [f"kvm: {error}"]


def test_numa_vm_with_hugepages_and_host_nodes_starts() -> None:
    conf = BASE | {
        "sockets": "2",
        "cores": "16",
        "numa": "1",
        "hugepages": "1024",
        "numa0": "cpus=0-15,hostnodes=0,memory=196608,policy=bind",
        "numa1": "cpus=16-31,hostnodes=1,memory=196608,policy=bind",
        "hostpci0": "mapping=gpu,pcie=1",
    }

    assert verdict(100, conf, [_gpu(0)]) is None


def test_error_qemu_quotes_the_option_as_qemu_server_wrote_it() -> None:
    conf = BASE | {"hostpci0": "mapping=gpu,pcie=1", "hostpci1": "mapping=gpu1,pcie=1"}
    same_slot = [_gpu(0), HostPci(1, ("0000:41:00.0",))]
    conf |= {"args": "-device vfio-pci,host=0000:99:00.0,id=extra,bus=ich9-pcie-port-2,addr=0x0"}

    assert verdict(100, conf, same_slot) == [
        "kvm: -device vfio-pci,host=0000:99:00.0,id=extra,bus=ich9-pcie-port-2,addr=0x0: "
        "PCI: slot 0 function 0 not available for vfio-pci, in use by vfio-pci,id=hostpci1"
    ]


def test_lab_replacements_exactly() -> None:
    conf = BASE | {
        "hostpci0": "mapping=gpu,pcie=1",
        "hostpci4": "mapping=gpu4,pcie=1",
        "args": "-set device.hostpci0.x-nv-gpudirect-clique=0",
    }
    run = lab_run(100, conf, [_gpu(0, functions=1), _gpu(4)], host_phys_bits=48)
    cfg = run.argv[run.argv.index("-readconfig") + 1]

    assert Path(cfg).read_text().startswith('[device "ehci"]\n  driver = "ich9-usb-ehci1"\n')
    assert run.argv == [
        *(
            "kvm",
            "-S",
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "none",
            "-qmp",
            "stdio",
            "-accel",
            "tcg",
        ),
        "-blockdev",
        '{"driver":"raw","file":{"driver":"file","filename":"/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"},'
        '"node-name":"pflash0","read-only":true}',
        "-blockdev",
        '{"driver":"raw","file":{"driver":"file","filename":"/usr/share/OVMF/OVMF_VARS_4M.fd"},'
        '"node-name":"drive-efidisk0","read-only":true}',
        *("-smp", "32,sockets=1,cores=32,maxcpus=32", "-cpu", "max,+kvm_pv_eoi,+kvm_pv_unhalt"),
        *("-object", "memory-backend-ram,id=lab-ram,size=393216M,reserve=off", "-m", "393216"),
        *("-readconfig", cfg),
        *("-device", "pci-testdev,id=hostpci0,bus=ich9-pcie-port-1,addr=0x0"),
        "-device",
        "pcie-root-port,id=ich9-pcie-port-5,addr=10.0,x-speed=16,x-width=32,multifunction=on,bus=pcie.0,port=5,"
        "chassis=5",
        *("-device", "pci-testdev,id=hostpci4.0,bus=ich9-pcie-port-5,addr=0x0.0,multifunction=on"),
        *("-device", "pci-testdev,id=hostpci4.1,bus=ich9-pcie-port-5,addr=0x0.1"),
        *("-machine", "pflash0=pflash0,pflash1=drive-efidisk0,hpet=off,type=q35,memory-backend=lab-ram"),
        *("-set", "device.hostpci0.id=hostpci0"),
    ]
    assert run.sets == {"hostpci0": ["device.hostpci0.x-nv-gpudirect-clique=0"]}


def test_host_phys_bits_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("vendor_id\t: AuthenticAMD\naddress sizes\t: 52 bits physical, 57 bits virtual\n")
    assert host_phys_bits(cpuinfo) == 52
    cpuinfo.write_text("vendor_id\t: AuthenticAMD\n")
    assert host_phys_bits(cpuinfo) == 40


# --- the hypervisor's answer and the start task -------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LabHost:
    monkeypatch.setenv("PVEGPU_LAB_RUN", str(tmp_path))
    host = LabHost("pve1", "netns", "reference", 3, 1, 1, "ssh-ed25519 AAAA", "/sys", "/proc/cmdline")
    host.state_dir.mkdir(parents=True, exist_ok=True)
    (host.state_dir / "host.json").write_text(json.dumps(asdict(host)))
    return host


@pytest.mark.usefixtures("node")
def test_error_hypervisor_answers_qemus_refusal_and_starts_nothing() -> None:
    devices = [{"hostpci": 0, "pcie": True, "functions": ["0000:41:00.0", "0000:41:00.1"]}]
    request = {
        "action": "start",
        "vmid": 100,
        "devices": devices,
        "disk": None,
        "config": BASE
        | {"hostpci0": "mapping=gpu,pcie=1", "args": "-set device.hostpci0.0.x-nv-gpudirect-clique=0"},
    }

    assert hypervisor.handle("pve1", request, "netns") == {
        "ok": False,
        "error": "QEMU exited with code 1",
        "log": ['kvm: -set device.hostpci0.0.x-nv-gpudirect-clique=0: there is no device "hostpci0" defined'],
    }


@pytest.mark.usefixtures("node")
def test_error_hypervisor_answers_what_qemu_server_dies_of_before_qemu() -> None:
    devices = [{"hostpci": 0, "pcie": True, "functions": ["0000:41:00.0"]}]
    request = {
        "action": "start",
        "vmid": 100,
        "devices": devices,
        "config": {"hostpci0": "mapping=gpu,pcie=1"},
    }

    assert hypervisor.handle("pve1", request, "netns") == {
        "ok": False,
        "error": "q35 machine model is not enabled",
    }


def test_hypervisor_serves_the_nodes_directory(node: LabHost) -> None:
    (node.root / "var/lib/pvegpu/models").mkdir(parents=True)
    request = {
        "action": "start",
        "vmid": 100,
        "devices": [],
        "virtiofs": [{"index": 0, "dirid": "models", "path": "/var/lib/pvegpu/models"}],
        "disk": None,
        "config": VIRTIOFS_CONF,
    }

    assert hypervisor.handle("pve1", request, "netns") == {"ok": True, "pid": os.getpid(), "guest": None}
    gone = request | {"virtiofs": [{"index": 0, "dirid": "models", "path": "/srv/gone"}]}
    assert hypervisor.handle("pve1", gone, "netns") == {
        "ok": False,
        "error": "QEMU exited with code 1",
        "log": [VIRTIOFS_REFUSED],
    }


@pytest.fixture
def refusing_pve(tmp_path: Path) -> Iterator[Pve]:
    """The pvesh stand-in with a lab hypervisor refusing every start as the real one does on QEMU's error."""

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        del request
        return {
            "ok": False,
            "error": "QEMU exited with code 1",
            "log": ['kvm: -set a.b.c=1: there is no a "b"'],
        }

    hv = Hypervisor(tmp_path / "hv", reply)
    hv.folder.mkdir()
    settings: dict[str, Any] = {
        "node": "pve1",
        "sysfs_root": str(tmp_path / "sys"),
        "root": str(tmp_path / "root"),
    }
    settings |= {"hypervisor_dir": str(hv.folder), "hypervisor_timeout_s": 20}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    thread = threading.Thread(target=hv.serve, daemon=True)
    thread.start()
    yield Pve(tmp_path, hv)
    hv.stop.set()
    thread.join()


def test_error_start_task_logs_qemus_lines_then_fails_as_vm_start_nolock(refusing_pve: Pve) -> None:
    pve = refusing_pve
    pve("create", "/nodes/pve1/qemu", "--vmid", "100", "--args", "-set a.b.c=1")

    start = pve("create", "/nodes/pve1/qemu/100/status/start")
    status = pve.task(start, "qmstart")
    upid = status["upid"]
    log = pve.file(f"var/log/pve/tasks/{upid.split(':')[4][-1]}/{upid}")

    assert status["exitstatus"] == "start failed: QEMU exited with code 1"
    assert (
        log == 'kvm: -set a.b.c=1: there is no a "b"\n\nTASK ERROR: start failed: QEMU exited with code 1\n'
    )
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "stopped"
    assert re.fullmatch(r"UPID:pve1:.*:qmstart:100:root@pam:", upid)
