"""Every pure parser of pvegpu as a fuzz target: what it takes (lines of text), the one error type it may
raise (the project's parse error; none for the parsers documented never to raise), and the samples its
inputs are mutated from. tests/unit/test_fuzz_parsers.py runs a bounded number per target in CI;
scripts/fuzz.py runs many and prints a table.

Inputs are random lines, and real samples mutated a few times over (a line deleted, duplicated, swapped,
cut, a character or a number replaced, random text inserted, the output cut short). Samples come from the
repository's captured fixtures (tests/unit/fixtures, each with its `# SOURCE:` line), the real captures in
shared/fixtures/real when that folder is beside the repository (as on CI), and small documented samples
below for the outputs no capture holds.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from pvegpu.facts.boot import parse_boot_loader, parse_cmdline, parse_pveversion
from pvegpu.facts.cpu import parse_cpu_kernel
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.exporter_read import parse_exporter
from pvegpu.facts.hardware import parse_hardware
from pvegpu.facts.host_checks import parse_host_checks
from pvegpu.facts.host_driver import parse_host_driver
from pvegpu.facts.host_read import parse_state
from pvegpu.facts.lxc_devices import parse_nvidia_nodes, parse_nvml_version
from pvegpu.facts.nccl import parse_transports
from pvegpu.facts.nccl_journal import parse_nccl_runs
from pvegpu.facts.node_boot import parse_node_boot
from pvegpu.facts.node_read import parse_node_state
from pvegpu.facts.nvidia import parse_nvidia_smi, parse_version_file
from pvegpu.facts.p2p_record import parse_record
from pvegpu.facts.pci_cfg import parse_pci_cfg
from pvegpu.facts.pve_files import mappings_answer, qemu_config_answer, storage_answer
from pvegpu.facts.pvegpu_boot import parse_boot_files
from pvegpu.facts.secret_files import parse_secret_files
from pvegpu.facts.sglang import parse_probe, parse_venv
from pvegpu.models.lxc import LxcSpec
from pvegpu.models.p2p import RECORD_PATH, Identity, Record
from pvegpu.models.pve import MapEntryError, parse_map_entry
from pvegpu.models.vm import VmSpec
from pvegpu.plan.bench import parse_history, parse_results
from pvegpu.plan.errors import PlanError
from pvegpu.plan.hostpci import HostPciError, parse_hostpci
from pvegpu.plan.lxc import LxcDevices, container_config, diff_container, raw_of
from pvegpu.plan.vm import create_keys, diff_vm, vm_config
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.pve.transport import Method, Params, parse_pvesh_output

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/unit/fixtures"
REAL = Path(os.environ.get("PVEGPU_SHARED", REPO.parent / "shared")) / "fixtures/real"

Lines = tuple[str, ...]


@dataclass(frozen=True)
class Target:
    """`parse(lines)` may return anything or raise `errors` (its message must say what was wrong); any
    other exception is a crash. `seeds` are the samples mutated into inputs."""

    name: str
    parse: Callable[[Lines], object]
    errors: tuple[type[Exception], ...]
    seeds: tuple[Lines, ...]


def fixture(name: str) -> Lines:
    """A captured fixture's lines, without its `# SOURCE:` line."""
    lines = (FIXTURES / name).read_text().splitlines()
    return tuple(line for line in lines if not line.startswith("# SOURCE:"))


def real(name: str) -> tuple[Lines, ...]:
    """A real capture's lines (without `# SOURCE:`), or nothing when shared/ is not beside the repository."""
    path = REAL / name
    if not path.is_file():
        return ()
    return (tuple(line for line in path.read_text().splitlines() if not line.startswith("# SOURCE:")),)


def _real_vm_configs() -> tuple[Lines, ...]:
    """The VM configs (`<vmid>.conf`) of qemu-server's own tests, one per `#### FILE:` block."""
    blocks = [block for text in real("20_proxmox_qemu_server_hostpci_vm_configs_and_kvm_cmdlines.txt")
              for block in "\n".join(text).split("#### FILE: ")[1:]]  # fmt: skip
    return tuple(
        tuple(block.splitlines()[1:]) for block in blocks if block.split("\n", 1)[0].endswith(".conf")
    )


def _real_map_entries() -> Lines:
    """The `map` property strings of Proxmox's pci.cfg test fixture."""
    return tuple(
        entry for text in real("21_proxmox_pci_mapping_test_fixture_and_docs_pvesh_example.txt")
        for entry in re.findall(r"'(node=[^']+)'", "\n".join(text))
    )  # fmt: skip


MAP_ENTRIES = _real_map_entries() or ("node=localhost,path=0000:01:00.4,id=10de:2231,iommugroup=1",)
PCI_CFG = (
    "someGpu",
    *(f"\tmap {entry}" for entry in MAP_ENTRIES[:3]),
    "\tmdev 1",
    "",
    "gpu0",
    "\tdescription pvegpu GPU 0",
    "\tmap id=10de:2bb1,iommugroup=31,node=pve1,path=0000:41:00.0;0000:41:00.1,subsystem-id=10de:204b",
    "\tlive-migration-capable 0",
)


def _file(lines: Lines) -> bytes:
    """A file's bytes from fuzzed lines (a lone surrogate gives bytes that are not UTF-8, as a file may)."""
    return "\n".join(lines).encode(errors="surrogatepass")


# The lab node's hardware (its captured state read), for checking pci.cfg's map lines of node pve1 against.
REFERENCE_HARDWARE = parse_node_state(fixture("node_state_lab_node.txt")).hardware
BOOT_LOADER = (  # BootLoader's output on a systemd-boot host (tests/unit/facts/test_boot.py's real hp1)
    "#pvegpu:files", "/etc/kernel/proxmox-boot-uuids", "/etc/kernel/cmdline",
    "#pvegpu:commands", "proxmox-boot-tool", "update-grub",
    "#pvegpu:esps", "6D31-87F4", "CE07-1118",
    "#pvegpu:status",
    "System currently booted with uefi",
    "6D31-87F4 is configured with: uefi (versions: 6.8.12-4-pve)",
    "CE07-1118 is configured with: uefi (versions: 6.8.12-4-pve)",
    "#pvegpu:end",
)  # fmt: skip
BOOT_FILES = (  # PvegpuBootFiles' output (tests/unit/facts/test_host.py)
    "#pvegpu:kernel_cmdline", "present", "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet",
    "#pvegpu:backup", "present", "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet",
    "#pvegpu:grub_dropin", "present", 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} amd_iommu=on iommu=pt"',
    "#pvegpu:owned", "present", "amd_iommu=on", "iommu=pt",
    "#pvegpu:modules_load", "present", "vfio", "vfio_pci",
    "#pvegpu:modprobe", "present", "options vfio-pci ids=10de:2bb1,10de:22e8",
    "#pvegpu:grub_cfg", "present", "newer-than-dropin",
    "\tlinux\t/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet amd_iommu=on iommu=pt",
    "#pvegpu:esps", "esp 5A1B-2C3D", "options  root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet", "esp 5A1B-9999",
    "unreadable",
    "#pvegpu:initramfs", "initrd.img-6.8.12-4-pve",
    "#pvegpu:end",
)  # fmt: skip
HOST_CHECKS = (  # HostChecks' output on an AMD host (interrupt remapping, 3 idle states, 2 NUMA nodes)
    "#pvegpu:interrupts", "612",
    "#pvegpu:cpuidle",
    "/sys/devices/system/cpu/cpu0/cpuidle/state0/name:POLL",
    "/sys/devices/system/cpu/cpu0/cpuidle/state1/name:C1",
    "/sys/devices/system/cpu/cpu0/cpuidle/state2/name:C2",
    "/sys/devices/system/cpu/cpu0/cpuidle/state0/disable:0",
    "/sys/devices/system/cpu/cpu0/cpuidle/state2/disable:1",
    "#pvegpu:numa",
    "/sys/devices/system/node/node0/cpulist:0-31,64-95",
    "/sys/devices/system/node/node1/cpulist:32-63,96-127",
    "#pvegpu:config", "0000:41:00.0 de10b12b0700100000000203",
    "#pvegpu:iommu_types",
    "/sys/kernel/iommu_groups/27/type:DMA-FQ", "/sys/kernel/iommu_groups/31/type:identity",
    "#pvegpu:end",
)  # fmt: skip
NVIDIA_NODES = (  # NvidiaDeviceNodes' output: capability nodes, then /proc/devices
    "#pvegpu:caps", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
    "#pvegpu:devices", "Character devices:", "  1 mem", "195 nvidia", "195 nvidiactl", "508 nvidia-uvm",
    "", "Block devices:", "  8 sd",
    "#pvegpu:end",
)  # fmt: skip
NCCL = (  # NCCL_DEBUG=INFO channel lines, every format parse_transports documents
    "llm:1234:1234 [0] NCCL INFO Ring 00 : 0[1b000] -> 7[41000] via direct shared memory",
    "llm:1234:1234 [1] NCCL INFO Channel 00 : 1[1] -> 2[2] via SHM/direct/direct",
    "llm:1234:1234 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "llm:1234:1234 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3",
    "llm:1234:1234 [0] NCCL INFO Connected all rings",
)
NCCL_JOURNAL = (  # SglangNcclRuns' output: the current invocation, then journalctl -o json entries
    "current 5a1f",
    *(
        json.dumps(
            {"__REALTIME_TIMESTAMP": "1764612000000000", "_SYSTEMD_INVOCATION_ID": run, "MESSAGE": text}
        )
        for run, text in (
            ("5a1f", "llm:1:1 [0] NCCL INFO NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml"),
            ("5a1f", NCCL[1]),
            ("77c0", NCCL[2]),
        )
    ),
)
LXC_CONFIG = (  # /etc/pve/lxc/200.conf of a container pvegpu made (pct config output)
    "arch: amd64", "cores: 64", "hostname: llm-ct", "memory: 786432", "onboot: 1", "swap: 0",
    "dev0: /dev/nvidia0", "dev1: /dev/nvidiactl", "dev9: /dev/nvidia-caps/nvidia-cap1",
    "lxc.cgroup2.devices.allow: c 195:* rwm",
    "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,create=file",
    "net0: name=eth0,bridge=vmbr0,ip=dhcp", "rootfs: local-lvm:vm-200-disk-0,size=64G",
)  # fmt: skip
PVESH_JSON = (  # pvesh --output-format json answers the readers take (proxmox-api-behaviour.md)
    ('[{"id":"gpu0","digest":"4c2a","map":["id=10de:2bb1,iommugroup=31,node=pve1,path=0000:41:00.0"],'
     '"checks":[{"severity":"warning","message":"iommu group changed"}]}]',),
    ('{"digest":"0e3b","name":"llm","hostpci0":"mapping=gpu0,pcie=1","net0":"virtio=BC:24:11:00:00:01,'
     'bridge=vmbr0","args":"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"}',),
    ('{"vmid":100,"status":"running","qmpstatus":"running","name":"llm"}',),
    ('{"vmid":"100","status":"stopped","name":"llm"}',),  # pvesh gives some numbers as strings
    ('{"status":"stopped","exitstatus":"OK","upid":"UPID:pve1:0000C530:0016ECE9:6745A1B2:qmstart:100:root@pam:"}',),
    ("update VM 100: -hostpci0 mapping=gpu0,pcie=1", "null"),
)  # fmt: skip
UPID = "UPID:pve1:0000C530:0016ECE9:6745A1B2:qmstart:100:root@pam:"
PVESH_ERRORS = (
    ("400 Parameter verification failed.", "map: invalid format - path: property is missing", "",
     "pvesh create <api_path> --id <string> [OPTIONS] [FORMAT_OPTIONS]"),
    ("Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist",),
    ("500 unable to open file '/etc/pve/mapping/pci.cfg.tmp.1234' - Permission denied",),
)  # fmt: skip
P2P_RECORD = Record(  # the P2P probe's record as pvegpu writes it (pvegpu/operations/p2p.py)
    "probe", "shm", Identity("580.95.05", "6.18.44-fc-v1045", "hostpci0=mapping=gpu0,pcie=1; C"), ("x",), "s"
)
# The lab guest's state read as a request for the P2P record prints it (synthesized: the capture's request
# had no record): the `records` section before the end marker.
GUEST_STATE_WITH_RECORD = (
    *fixture("guest_state_lab_vm.txt")[:-1],
    "#pvegpu:records",
    f"{base64.b64encode(P2P_RECORD.text().encode()).decode()}\t{RECORD_PATH}",
    "#pvegpu:end",
)
VM_SPEC = VmSpec(vmid=100, name="llm", cores=64, memory=786432)
LXC_SPEC = LxcSpec(vmid=200, ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst")


def config_of(lines: Lines) -> dict[str, object]:
    """`key: value` lines (a guest config file, `qm/pct config`) as the API reads them: raw `lxc.*` lines
    under `lxc` as `[key, value]` pairs, comments and snapshot sections left out."""
    config: dict[str, object] = {}
    raw: list[list[str]] = []
    for line in lines:
        if line.startswith("["):
            break
        key, sep, value = line.partition(":")
        if not sep or line.startswith("#"):
            continue
        if key.startswith("lxc."):
            raw.append([key, value.strip()])
        else:
            config[key] = value.strip()
    if raw:
        config["lxc"] = raw
    return config


def _qemu_config(lines: Lines) -> object:
    desired = vm_config(VM_SPEC, ["gpu0", "gpu1"], None)
    return diff_vm(desired, create_keys(VM_SPEC), config_of(lines), "gpu")


def _lxc_config(lines: Lines) -> object:
    current = config_of(lines)
    desired = container_config(LXC_SPEC, LxcDevices({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl"}, ()))
    return diff_container(desired, current), raw_of(current)


def _pvesh_readers(lines: Lines) -> object:
    """pvesh's stdout, as every PveClient reader takes it, and the config readers' values as the VM and
    container planners take them."""
    data = parse_pvesh_output("\n".join(lines), "", 0)

    def answer(method: Method, path: str, params: Params) -> object:
        del method, path, params  # every reader gets the same answer
        return data

    client = PveClient(call=answer)
    readers: tuple[Callable[[], object], ...] = (
        lambda: client.mappings(check_node="pve1"),
        lambda: client.mapping("gpu0"),
        lambda: client.vm_status("pve1", 100),
        lambda: client.lxc_status("pve1", 200),
        lambda: client.task_status(UPID),
        lambda: _qemu_config_values(client.vm_config("pve1", 100).values),
        lambda: raw_of(client.lxc_config("pve1", 200).values),
    )
    results = []
    for read in readers:
        try:
            results.append(read())
        except (PveError, HostPciError) as error:
            results.append(error)  # each reader on its own: the next one still runs
    return results


def _qemu_config_values(values: dict[str, object]) -> object:
    return diff_vm(vm_config(VM_SPEC, ["gpu0"], None), create_keys(VM_SPEC), values, "gpu")


def _pvesh_error(lines: Lines) -> object:
    return parse_pvesh_output("", "\n".join(lines), 255)


TARGETS: tuple[Target, ...] = (
    Target(
        "hardware snapshot (facts.hardware.parse_hardware)",
        parse_hardware,
        (FactParseError,),
        tuple(fixture(name) for name in sorted(os.listdir(FIXTURES)) if name.startswith("pci_hardware_")),
    ),
    Target(
        "pci.cfg (facts.pci_cfg.parse_pci_cfg)",
        lambda lines: parse_pci_cfg("\n".join(lines) + "\n"),
        (),  # never raises: Proxmox's warnings and errors are part of its result
        (PCI_CFG,),
    ),
    Target(
        "pci.cfg map entry (models.pve.parse_map_entry)",
        lambda lines: parse_map_entry(",".join(lines)),
        (MapEntryError,),
        (MAP_ENTRIES,),
    ),
    Target(
        "/proc/cmdline (facts.boot.parse_cmdline)",
        parse_cmdline,
        (),
        (fixture("proc_cmdline_sandbox_vm.txt"),),
    ),
    Target(
        "pveversion (facts.boot.parse_pveversion)",
        parse_pveversion,
        (FactParseError,),
        (("pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.12-1-pve)",),),
    ),
    Target(
        "boot loader (facts.boot.parse_boot_loader)", parse_boot_loader, (FactParseError,), (BOOT_LOADER,)
    ),
    Target(
        "boot files (facts.pvegpu_boot.parse_boot_files)", parse_boot_files, (FactParseError,), (BOOT_FILES,)
    ),
    Target(
        "node boot (facts.node_boot.parse_node_boot)",
        parse_node_boot,
        (FactParseError,),
        ((*BOOT_LOADER, *BOOT_FILES),),
    ),
    Target(
        "cpu/kernel (facts.cpu.parse_cpu_kernel)",
        parse_cpu_kernel,
        (FactParseError,),
        (("6.8.12-4-pve", "vendor_id\t: AuthenticAMD"), ("6.18.44-fc-v657-gpu", "vendor_id\t: GenuineIntel")),
    ),
    Target(
        "host state (facts.host_read.parse_state)",
        parse_state,
        (FactParseError,),
        (
            fixture("guest_state_lab_vm.txt"),
            GUEST_STATE_WITH_RECORD,
            # a request for the initramfs images older than the nouveau blacklist (synthesized)
            (
                *fixture("guest_state_lab_vm.txt")[:-1],
                "#pvegpu:initramfs",
                "initrd.img-6.1.0-28-amd64",
                "#pvegpu:end",
            ),
        ),
    ),
    Target(
        "P2P probe record (facts.p2p_record.parse_record)",
        lambda lines: parse_record("\n".join(lines)),
        (),
        (tuple(P2P_RECORD.text().splitlines()),),
    ),
    Target(
        "node state (facts.node_state.parse_node_state)",
        parse_node_state,
        (FactParseError,),
        (fixture("node_state_lab_node.txt"),),
    ),
    Target(
        "host checks (facts.host_checks.parse_host_checks)",
        parse_host_checks,
        (FactParseError,),
        (HOST_CHECKS,),
    ),
    Target(
        "host driver files (facts.host_driver.parse_host_driver)",
        parse_host_driver,
        (),
        (
            (
                "file /etc/modules-load.d/pvegpu-nvidia.conf",
                "unit sglang.service enabled active",
                "unit nvidia-persistenced.service disabled inactive",
            ),
        ),
    ),
    Target(
        "NVIDIA device nodes (facts.lxc_devices.parse_nvidia_nodes)",
        parse_nvidia_nodes,
        (FactParseError,),
        (NVIDIA_NODES,),
    ),
    Target(
        "NVML version (facts.lxc_devices.parse_nvml_version)",
        parse_nvml_version,
        (),
        (("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",),),
    ),
    Target(
        "NVIDIA version file (facts.nvidia.parse_version_file)",
        parse_version_file,
        (FactParseError,),
        (fixture("proc_driver_nvidia_version_h200.txt"),),
    ),
    Target(
        "nvidia-smi (facts.nvidia.parse_nvidia_smi)",
        parse_nvidia_smi,
        (),
        (fixture("nvidia_smi_query_h200.txt"), *real("03_nvidia_smi_epyc9374f_4x_rtx6000ada.txt")),
    ),
    Target(
        "NCCL log (facts.nccl.parse_transports)",
        parse_transports,
        (FactParseError,),
        (
            NCCL,
            *(
                lines
                for name in (
                    "13_nccl_debug_info_p2p_ipc_read_channels.txt",
                    "14_nccl_debug_info_shm_and_p2p_older_formats.txt",
                    "15_nccl_debug_info_shm_direct_vs_p2p_cumem_4x_a100.txt",
                )
                for lines in real(name)
            ),
        ),
    ),
    Target(
        "NCCL runs in the journal (facts.nccl_journal.parse_nccl_runs)",
        parse_nccl_runs,
        (FactParseError,),
        (NCCL_JOURNAL,),
    ),
    Target(
        "secret files (facts.secret_files.parse_secret_files)",
        parse_secret_files,
        (FactParseError,),
        (("file 0 600 22 1 0 0 0\t/root/sglang-api-key", "missing\t/root/hf-token", "symlink\t/etc/k"),),
    ),
    Target(
        "node exporter (facts.exporter_read.parse_exporter)",
        parse_exporter,
        (FactParseError,),
        (fixture("exporter_read_lab_node.txt"),),
    ),
    Target("SGLang venv (facts.sglang.parse_venv)", parse_venv, (FactParseError,), (("version 0.5.23",),)),
    Target("SGLang probe (facts.sglang.parse_probe)", parse_probe, (), (("ok glm-5",), ("fail HTTP 503",))),
    Target(
        "qemu hostpci (plan.hostpci.parse_hostpci)",
        lambda lines: parse_hostpci(",".join(lines)),
        (HostPciError,),
        (("mapping=gpu0", "pcie=1"), ("0000:41:00.0", "pcie=on", "rombar=0")),
    ),
    Target(
        "qemu config (plan.vm.diff_vm)",
        _qemu_config,
        (HostPciError,),
        (
            (
                "name: llm",
                "hostpci0: mapping=gpu0,pcie=1",
                "net0: virtio=BC:24:11:00:00:01,bridge=vmbr0",
                "args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144",
            ),
            *_real_vm_configs(),
        ),
    ),
    Target(
        "VM config file (facts.pve_files.qemu_config_answer)",
        lambda lines: qemu_config_answer(_file(lines)),
        (),
        (("cores: 2", "onboot: 1", "#a %20description", "", "[PENDING]", "cores: 4"), *_real_vm_configs()),
    ),
    Target(
        "storage.cfg (facts.pve_files.storage_answer)",
        lambda lines: storage_answer(_file(lines), "local"),
        (),
        (("dir: local", "\tpath /var/lib/vz", "\tcontent iso,vztmpl,import,snippets", "", "lvmthin: data"),),
    ),
    Target(
        "pci.cfg checked on a node (facts.pve_files.mappings_answer)",
        lambda lines: mappings_answer(_file(lines), "pve1", REFERENCE_HARDWARE),
        (),
        (PCI_CFG,),
    ),
    Target("lxc config (plan.lxc.diff_container, raw_of)", _lxc_config, (), (LXC_CONFIG,)),
    Target("pvesh JSON readers (pve.PveClient)", _pvesh_readers, (), PVESH_JSON),
    Target("pvesh errors (pve.parse_pvesh_output)", _pvesh_error, (PveError,), PVESH_ERRORS),
    Target(
        "benchmark results (plan.bench.parse_results)",
        lambda lines: parse_results(lines, 1024),
        (PlanError,),
        (
            (
                json.dumps(
                    {
                        "max_concurrency": 4,
                        "completed": 16,
                        "output_throughput": 812.5,
                        "request_throughput": 0.79,
                        "median_ttft_ms": 210.0,
                        "p99_ttft_ms": 480.2,
                        "median_itl_ms": 4.9,
                    }
                ),
            ),
        ),
    ),
    Target(
        "benchmark history (plan.bench.parse_history)",
        parse_history,
        (PlanError,),
        (
            (
                '{"host": "gpu-vm", "run": "20261201T180000Z", "settings": {"numa": "host", "p2p": "off", '
                '"topo_file": "on"}, "rows": [{"concurrency": 1, "completed": 4, "output_throughput": 11.0, '
                '"request_throughput": 0.1, "median_ttft_ms": 90.0, "p99_ttft_ms": 99.0, '
                '"median_itl_ms": 9.0}]}',
                '{"host": "gpu-vm", "run": "20261101T180000Z", "rows": []}',
            ),
        ),
    ),
)

# Values a mutation puts where a number was: out of range, negative, not ASCII digits, too long for int().
ODD_NUMBERS = ("-1", "0", "4294967296", "99999999999999999999", "²", "٣", "1" * 5000, "0x", "1e9", "NaN", "")
_LINE = st.text(st.characters(exclude_characters="\n\r"), max_size=60)
_NUMBER = re.compile(r"\d+")


@st.composite
def _mutated(draw: st.DrawFn, seeds: tuple[Lines, ...]) -> Lines:
    lines = list(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(len(lines) - 1, 0)))
        line = lines[at] if lines else ""
        kind = draw(st.integers(0, 8))
        if kind == 0 and lines:
            del lines[at]
        elif kind == 1 and lines:
            lines.insert(at, line)
        elif kind == 2 and lines:
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], line
        elif kind == 3:
            lines = lines[:at]  # the output cut short
        elif kind == 4 and lines:
            lines[at] = line[: draw(st.integers(0, len(line)))]
        elif kind == 5:
            cut = draw(st.integers(0, len(line)))
            lines[at:at + 1] = [line[:cut] + draw(_LINE) + line[cut:]]  # fmt: skip
        elif kind == 6 and line:
            cut = draw(st.integers(0, len(line) - 1))
            lines[at] = line[:cut] + draw(st.characters()) + line[cut + 1 :]
        elif kind == 7 and _NUMBER.search(line):
            spans = [match.span() for match in _NUMBER.finditer(line)]
            start, end = draw(st.sampled_from(spans))
            lines[at] = line[:start] + draw(st.sampled_from(ODD_NUMBERS)) + line[end:]
        else:
            lines.insert(at, draw(_LINE))
    return tuple(lines)


def inputs(target: Target) -> st.SearchStrategy[Lines]:
    """Random lines, or one of the target's samples mutated (most of the draws: they reach deeper)."""
    random_lines = st.lists(_LINE, max_size=12).map(tuple)
    return st.one_of(random_lines, _mutated(target.seeds), _mutated(target.seeds))


def crash(target: Target, lines: Sequence[str]) -> str | None:
    """None when `target` parses `lines` or refuses them with its error and a message; else what happened."""
    try:
        target.parse(tuple(lines))
    except target.errors as error:
        if not str(error).strip():
            return f"{type(error).__name__} without a message"
    except Exception as error:  # any other exception is the finding
        return f"{type(error).__name__}: {error}"[:300]
    return None
