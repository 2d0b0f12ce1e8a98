"""The lab's QEMU command line (lab/pve/qemu_cmdline.py): qemu-server's own regression outputs
(shared/fixtures/real/20_*: its cfg2cmd configs and the command lines it printed for them) rebuilt part by
part, and the exact parts of the lab's reference VM (8 multifunction GPUs, root ports), a single-function
clique VM and a NUMA VM."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest

from lab.pve.qemu_cmdline import HostPci, config_parts
from lab.pve.qemu_config import QemuCmdlineError, parse_property_string
from tests.unit.realdata import real_fixture

CFG2CMD = "20_proxmox_qemu_server_hostpci_vm_configs_and_kvm_cmdlines.txt"
NAMES = (
    "q35-linux-hostpci",
    "q35-linux-hostpci-multifunction",
    "q35-linux-hostpci-mapping",
    "q35-linux-hostpci-x-pci-overrides",
    "q35-win10-hostpci",
    "i440fx-win10-hostpci",
)
# qemu-server src/test/run_config2command_tests.pl: the mocked host's PCI devices (`$pci_devs`, what its
# mocked SysFSTools::lspci filters) and PCI mappings (`$pci_map_config`: each map line's path), VMID 8006.
MOCK_PCI = sorted(
    [
        *("0000:00:43.1", "0000:00:f4.0", "0000:00:ff.1", "0000:0f:f2.0", "0000:d0:13.0", "0000:d0:15.1"),
        *("0000:d0:15.2", "0000:d0:17.0", "0000:f0:42.0", "0000:f0:43.0", "0000:f0:43.1", "1234:f0:43.1"),
        *("0000:01:00.4", "0000:01:00.5", "0000:01:00.6", "0000:07:10.0", "0000:07:10.1", "0000:07:10.4"),
    ]
)
MOCK_MAPPINGS = {
    "someGpu": ["0000:01:00.4", "0000:01:00.5", "0000:01:00.6"],
    "someNic": ["0000:07:10.0", "0000:07:10.1", "0000:07:10.4"],
}
MOCK_VMID = 8006
# The parts this module builds: compared option by option with qemu-server's command line.
COMPARED_OPTIONS = ("-smp", "-cpu", "-m", "-numa", "-readconfig", "-machine")
COMPARED_VALUES = ("memory-backend-", "vfio-pci,", "pcie-root-port,", "pci-bridge,")


def _cfg2cmd_cases() -> list[tuple[str, dict[str, str], list[str]]]:
    """(test name, its config, the command line qemu-server printed) for each block of the fixture."""
    text = real_fixture(CFG2CMD).read_text()
    blocks = re.split(r"^#### FILE: (\S+)\n", text, flags=re.MULTILINE)[1:]
    files = dict(zip(blocks[::2], blocks[1::2], strict=True))
    cases = []
    for name, body in files.items():
        if not name.endswith(".conf"):
            continue
        conf = dict(line.split(": ", 1) for line in body.splitlines() if line and not line.startswith("#"))
        cases.append((Path(name).stem, conf, shlex.split(files[f"{name}.cmd"].replace("\\\n", " "))))
    return cases


def _mock_devices(conf: dict[str, str]) -> list[HostPci]:
    """PCI.pm parse_hostpci + choose_hostpci_devices on the mocked host: each hostpciN's functions (an id
    without a function: the slot's functions), the first alternative none of whose functions is taken."""
    used: set[str] = set()
    devices = []
    for index in range(16):
        if f"hostpci{index}" not in conf:
            continue
        options = parse_property_string(conf[f"hostpci{index}"], "host")
        paths = (
            [[p] for p in MOCK_MAPPINGS[options["mapping"]]]
            if "mapping" in options
            else [options["host"].split(";")]
        )
        for alternative in paths:
            found = [
                d for pci_id in alternative for d in MOCK_PCI if re.match(rf"(0000:)?{re.escape(pci_id)}", d)
            ]
            if not used & set(found):
                used |= set(found)
                devices.append(HostPci(index, tuple(found[:1] if "mdev" in options else found)))
                break
    return devices


def _compared(argv: list[str]) -> list[str]:
    picked = []
    for option, value in itertools.pairwise(argv):
        if option in COMPARED_OPTIONS or (
            option in ("-object", "-device") and value.startswith(COMPARED_VALUES)
        ):
            picked += [option, value]
    return picked


def _case(name: str) -> tuple[dict[str, str], list[str]]:
    return next((conf, cmd) for test, conf, cmd in _cfg2cmd_cases() if test == name)


def test_the_fixture_holds_every_hostpci_case() -> None:
    assert tuple(name for name, _, _ in _cfg2cmd_cases()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_cfg2cmd_parts_equal_qemu_servers(name: str) -> None:
    conf, expected = _case(name)

    parts = config_parts(MOCK_VMID, conf, _mock_devices(conf))

    assert _compared(parts) == _compared(expected)
    assert len(_compared(parts)) >= 10  # smp, cpu, m, machine and at least one device each time


def test_multifunction_ids_are_hostpci_n_dot_j_from_the_fixture() -> None:
    conf, expected = _case("q35-linux-hostpci-multifunction")

    devices = [v for o, v in itertools.pairwise(expected) if o == "-device" and "vfio" in v]
    ids = [parse_property_string(d.split(",", 1)[1])["id"] for d in devices]
    assert ids == ["hostpci0.0", "hostpci0.1", "hostpci1"]
    assert _compared(config_parts(MOCK_VMID, conf, _mock_devices(conf)))[-6:-2] == [
        "-device",
        "vfio-pci,host=0000:f0:43.1,id=hostpci0.1,bus=pci.0,addr=0x10.1",
        "-device",
        "vfio-pci,host=1234:f0:43.1,id=hostpci1,bus=pci.0,addr=0x11",
    ]


# --- the lab's VMs ------------------------------------------------------------------------------------------

REFERENCE = {
    "name": "llm",
    "machine": "q35",
    "bios": "ovmf",
    "ostype": "l26",
    "cpu": "host",
    "sockets": "1",
    "cores": "32",
    "memory": "393216",
    "numa": "0",
    "efidisk0": "local-lvm:vm-100-disk-0,efitype=4m,pre-enrolled-keys=0,size=4M",
    **{f"hostpci{i}": f"mapping=pvegpu-gpu{i},pcie=1" for i in range(8)},
    "args": "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1048576",
}
BUSES = ("41", "61", "71", "81", "a1", "c1", "d1", "e1")
GPUS = [HostPci(i, (f"0000:{bus}:00.0", f"0000:{bus}:00.1")) for i, bus in enumerate(BUSES)]
OVMF = [
    "-blockdev",
    '{"driver":"raw","file":{"driver":"file","filename":"/usr/share/pve-edk2-firmware/OVMF_CODE_4M.secboot.fd"},'
    '"node-name":"pflash0","read-only":true}',
    "-blockdev",
    '{"driver":"raw","file":{"driver":"file","filename":"/usr/share/pve-edk2-firmware/OVMF_VARS_4M.fd"},'
    '"node-name":"drive-efidisk0","read-only":true}',
]


def _root_port(index: int) -> list[str]:
    port, addr = index + 1, f"10.{index - 4}"
    return [
        "-device",
        f"pcie-root-port,id=ich9-pcie-port-{port},addr={addr},x-speed=16,x-width=32,multifunction=on,"
        f"bus=pcie.0,port={port},chassis={port}",
    ]


def test_reference_vm_eight_multifunction_gpus_on_root_ports() -> None:
    expected = [*OVMF, "-smp", "32,sockets=1,cores=32,maxcpus=32", "-cpu", "host,+kvm_pv_eoi,+kvm_pv_unhalt"]
    expected += ["-m", "393216", "-readconfig", "/usr/share/qemu-server/pve-q35-4.0.cfg"]
    for index, bus in enumerate(BUSES):
        expected += _root_port(index) if index > 3 else []
        expected += [
            "-device",
            f"vfio-pci,host=0000:{bus}:00.0,id=hostpci{index}.0,bus=ich9-pcie-port-{index + 1},addr=0x0.0,"
            "multifunction=on",
            "-device",
            f"vfio-pci,host=0000:{bus}:00.1,id=hostpci{index}.1,bus=ich9-pcie-port-{index + 1},addr=0x0.1",
        ]
    expected += ["-machine", "pflash0=pflash0,pflash1=drive-efidisk0,hpet=off,type=q35+pve0"]
    expected += ["-fw_cfg", "name=opt/ovmf/X-PciMmio64Mb,string=1048576"]

    assert config_parts(100, REFERENCE, GPUS) == expected


def test_single_function_clique_vm_sets_hostpci_n() -> None:
    conf = REFERENCE | {
        "cpu": "host,guest-phys-bits=45",
        "args": "-set device.hostpci0.x-nv-gpudirect-clique=0 -set device.hostpci1.x-nv-gpudirect-clique=0",
    }
    conf = {k: v for k, v in conf.items() if not re.fullmatch(r"hostpci[2-7]", k)}
    gpus = [HostPci(0, ("0000:41:00.0",)), HostPci(1, ("0000:61:00.0",))]

    assert config_parts(100, conf, gpus)[4:] == [
        *(
            "-smp",
            "32,sockets=1,cores=32,maxcpus=32",
            "-cpu",
            "host,+kvm_pv_eoi,+kvm_pv_unhalt,guest-phys-bits=45",
        ),
        *("-m", "393216", "-readconfig", "/usr/share/qemu-server/pve-q35-4.0.cfg"),
        *("-device", "vfio-pci,host=0000:41:00.0,id=hostpci0,bus=ich9-pcie-port-1,addr=0x0"),
        *("-device", "vfio-pci,host=0000:61:00.0,id=hostpci1,bus=ich9-pcie-port-2,addr=0x0"),
        *("-machine", "pflash0=pflash0,pflash1=drive-efidisk0,hpet=off,type=q35+pve0"),
        *(
            "-set",
            "device.hostpci0.x-nv-gpudirect-clique=0",
            "-set",
            "device.hostpci1.x-nv-gpudirect-clique=0",
        ),
    ]


def test_numa_vm_nodes_bound_to_host_nodes_with_hugepages() -> None:
    conf = {
        "machine": "pc-q35-9.2+pve1",
        "ostype": "l26",
        "cpu": "host,hidden=1,phys-bits=host",
        "sockets": "2",
        "cores": "16",
        "memory": "262144",
        "numa": "1",
        "hugepages": "1024",
        "numa0": "cpus=0-15,hostnodes=0,memory=131072,policy=bind",
        "numa1": "cpus=16-31,hostnodes=1,memory=131072,policy=bind",
    }

    assert config_parts(100, conf, []) == [
        *(
            "-smp",
            "32,sockets=2,cores=16,maxcpus=32",
            "-cpu",
            "host,kvm=off,+kvm_pv_eoi,+kvm_pv_unhalt,host-phys-bits=true",
        ),
        *("-m", "262144"),
        "-object",
        "memory-backend-file,id=ram-node0,size=131072M,mem-path=/run/hugepages/kvm/1048576kB,share=on,prealloc=yes,"
        "host-nodes=0,policy=bind",
        *("-numa", "node,nodeid=0,cpus=0-15,memdev=ram-node0"),
        "-object",
        "memory-backend-file,id=ram-node1,size=131072M,mem-path=/run/hugepages/kvm/1048576kB,share=on,prealloc=yes,"
        "host-nodes=1,policy=bind",
        *("-numa", "node,nodeid=1,cpus=16-31,memdev=ram-node1"),
        *("-readconfig", "/usr/share/qemu-server/pve-q35-4.0.cfg", "-machine", "type=pc-q35-9.2+pve0"),
    ]


# virtiofs: qemu-server 9.2.6 src/PVE/QemuServer/Virtiofs.pm config (the last devices), Memory.pm config (the
# shared memfd: without NUMA one `virtiofs-mem` the machine uses, with NUMA each node's `virtiofs-memN`).
VIRTIOFS_DEVICES = (
    *("-chardev", "socket,id=virtiofs0,path=/run/qemu-server/virtiofsd/vm100-fs0"),
    *("-device", "vhost-user-fs-pci,queue-size=1024,chardev=virtiofs0,tag=models"),
)


def test_virtiofs_vm_gets_a_shared_memfd_the_socket_and_the_device_last() -> None:
    share = "models,cache=always,expose-acl=1"  # the options are virtiofsd's (lab/pve/virtiofsd.py)
    conf = {"machine": "q35", "ostype": "l26", "memory": "8192", "virtiofs0": share}
    gpu = HostPci(0, ("0000:41:00.0",))

    assert config_parts(100, conf | {"hostpci0": "mapping=gpu0,pcie=1"}, [gpu]) == [
        *(
            "-smp",
            "1,sockets=1,cores=1,maxcpus=1",
            "-cpu",
            "kvm64,enforce,+kvm_pv_eoi,+kvm_pv_unhalt,+lahf_lm,+sep",
        ),
        *("-m", "8192", "-object", "memory-backend-memfd,id=virtiofs-mem,size=8192M,share=on"),
        *("-readconfig", "/usr/share/qemu-server/pve-q35-4.0.cfg"),
        *("-device", "vfio-pci,host=0000:41:00.0,id=hostpci0,bus=ich9-pcie-port-1,addr=0x0"),
        *VIRTIOFS_DEVICES,
        *("-machine", "hpet=off,memory-backend=virtiofs-mem,type=q35+pve0"),
    ]


def test_virtiofs_numa_vm_gets_a_shared_memfd_per_node() -> None:
    conf = {"sockets": "2", "memory": "4096", "numa": "1", "virtiofs0": "dirid=models"}

    assert config_parts(100, conf, [])[4:] == [
        *("-m", "4096"),
        *("-object", "memory-backend-memfd,id=virtiofs-mem0,size=2048M,share=on"),
        *("-numa", "node,nodeid=0,cpus=0,memdev=virtiofs-mem0"),
        *("-object", "memory-backend-memfd,id=virtiofs-mem1,size=2048M,share=on"),
        *("-numa", "node,nodeid=1,cpus=1,memdev=virtiofs-mem1"),
        *("-device", "pci-bridge,id=pci.1,chassis_nr=1,bus=pci.0,addr=0x1e"),
        *("-device", "pci-bridge,id=pci.2,chassis_nr=2,bus=pci.0,addr=0x1f"),
        *VIRTIOFS_DEVICES,
        *("-machine", "type=pc+pve0"),
    ]


@pytest.mark.parametrize(
    ("conf", "error"),
    [
        pytest.param(
            {"hostpci0": "mapping=gpu,pcie=1"}, "q35 machine model is not enabled", id="pcie-on-i440fx"
        ),
        pytest.param(
            {"numa": "1", "memory": "1024", "numa0": "cpus=0,memory=512"},
            "total memory for NUMA nodes must be equal to vm static memory",
            id="numa-memory",
        ),
        pytest.param(
            {"hugepages": "2"}, "numa needs to be enabled to use hugepages", id="hugepages-without-numa"
        ),
        pytest.param(
            {"numa": "1", "numa0": "cpus=0,hostnodes=0,memory=512"},
            "you need to define a policy for hostnode 0",
            id="hostnodes-without-policy",
        ),
    ],
)
def test_error_what_qemu_server_refuses_before_qemu(conf: dict[str, str], error: str) -> None:
    with pytest.raises(QemuCmdlineError) as raised:
        config_parts(100, conf, [HostPci(0, ("0000:41:00.0",))])
    assert str(raised.value) == error
