"""Real QEMU's verdict on a lab VM start: the parts lab/pve/qemu_cmdline.py builds, handed to Debian's QEMU.
LAB STAND-IN for the `kvm` process a Proxmox node starts (vm_start_nolock: `QEMU exited with code 1` and
QEMU's stderr in the task log); this is NOT Proxmox.

`verdict(vmid, conf, devices, host_phys_bits, shared_dirs)` runs Debian's qemu-system-x86_64 (7.2), started as
`kvm` as on a node so its errors read `kvm: ...`, with `-S` (no guest code runs): QEMU parses every option,
realizes every device, and quits on a QMP `quit`. It answers None when QEMU accepts the start, else QEMU's
stderr lines. Where QEMU would need what the lab has not got, the lab replaces that part, and only that:

- accelerator: TCG (`-accel tcg`; no KVM here). TCG refuses the `host` CPU model (`CPU model 'host' requires
  KVM or HVF`), so `host` becomes `max` (the model `host` derives from: the same properties, so phys-bits,
  host-phys-bits, kvm=off and every flag stay QEMU's to check). `guest-phys-bits` (QEMU 9.0+, unknown to 7.2)
  is taken out and checked as QEMU 9.0's x86_cpu_realizefn does: 32..phys-bits, phys-bits being the set value,
  the node's own with host-phys-bits or the `host` model (QEMU forces host-phys-bits for it), else TCG's 40;
- machine: `type=` without Proxmox's `+pveN` revision; a version newer than the lab QEMU's is its newest
  (`q35`, `pc`);
- memory: every RAM backend gets `reserve=off` (guest RAM is never allocated); without NUMA (and without
  virtiofs' own backend) the RAM is such a backend too (`-machine memory-backend=`); the hugepages file
  backend is a RAM backend; `host-nodes` are the lab machine's node 0 (the node's own NUMA nodes are the pvesh
  stand-in's check, as Memory.pm's);
- firmware: Debian's ovmf images (/usr/share/OVMF) for pve-edk2-firmware's; the vars drive is the firmware's
  VARS image, read-only (a lab efidisk volume holds no vars store);
- `-readconfig`: the lab's copy of qemu-server's pve-q35-4.0.cfg (qemu_q35_cfg.PVE_Q35_CFG);
- virtiofsN: each `-chardev socket` path (qemu-server's /run/qemu-server/virtiofsd/vm<vmid>-fs<N>) is a
  temporary socket, on which a real virtiofsd serves the mapping's directory (lab/pve/virtiofsd.py: Debian
  12's QEMU 7.2 virtiofsd with qemu-server's options), so `vhost-user-fs-pci` is realized against a real
  daemon (QEMU's `tag` limit, the chardev, the vhost-user handshake); its shared `memory-backend-memfd` stays
  memfd with `share=on`;
- vfio-pci: QEMU opens the host device (/dev/vfio) to realize one, so each becomes a `pci-testdev` with the
  same id, bus, addr, multifunction, rombar and romfile: QEMU still resolves every id (`-set
  device.hostpci0.0.x=1`: `there is no device "hostpci0" defined`), bus, slot and function. What only vfio-pci
  has (host, sysfsdev, x-vga, x-pci-*-id, bootindex, enable-migration, and a `-set device.<id>.<p>=<v>` of
  such a property, which the first run reads as `-set device.<id>.id=<id>`: QEMU's id check, nothing set) is
  checked by a second run per such device, in which it is the real vfio-pci: QEMU sets its properties (their
  names and ranges: `Property 'vfio-pci.<p>' not found`, `Property x-nv-gpudirect-clique: valid range 0-15`)
  and then fails to realize it (`vfio ...: no such host device`), which is the pass. vfio's realize-time
  clique check (hw/vfio/pci-quirks.c vfio_add_nv_gpudirect_cap: an NVIDIA vendor, a display class) is modelled
  from the vendor and class the node reports for the function;
- the lab's own options: `-S -nodefaults -display none -monitor none -qmp stdio -accel tcg`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lab.pve import virtiofsd
from lab.pve.qemu_cmdline import VIRTIOFS_SOCKETS, HostPci, config_parts
from lab.pve.qemu_config import QemuCmdlineError, parse_property_string, windows_version
from lab.pve.qemu_q35_cfg import PVE_Q35_CFG, PVE_Q35_CFG_PATH

QEMU = "/usr/bin/qemu-system-x86_64"
LAB_QEMU = (7, 2)  # Debian 12's qemu-system-x86
LAB_FIRMWARE = "/usr/share/OVMF"
STAND_IN = "pci-testdev"
TCG_PHYS_BITS = 40
LAB_OPTIONS = ("-S", "-nodefaults", "-display", "none", "-monitor", "none", "-qmp", "stdio", "-accel", "tcg")
QMP_QUIT = '{"execute": "qmp_capabilities"}\n{"execute": "quit"}\n'
TIMEOUT_S = 30.0
LAB_RAM = "lab-ram"
NVIDIA = 0x10DE
DISPLAY_CLASS = 0x03
# The stand-in keeps these (not properties: qdev_device_add takes them) and every property pci-testdev has
# (PCIDevice's own: addr, multifunction, rombar, romfile, ...).
STAND_IN_KEYS = ("id", "bus")
VFIO_ONLY_KEYS = ("host", "sysfsdev")  # what needs no check run: the stand-in stands for the host device
_TRANSFORMED = frozenset({"-cpu", "-m", "-object", "-readconfig", "-machine", "-device", "-set", "-chardev"})


@functools.cache
def device_properties(driver: str) -> frozenset[str]:
    """The property names `qemu-system-x86_64 -device <driver>,help` lists."""
    done = subprocess.run([QEMU, "-device", f"{driver},help"], capture_output=True, text=True, check=True)
    return frozenset(m.group(1) for m in re.finditer(r"^\s+([\w.-]+)=<", done.stdout, re.MULTILINE))


@functools.cache
def _q35_cfg() -> str:
    """The lab's copy of pve-q35-4.0.cfg: one file per content in the temporary directory, written atomically
    by the first process that needs it."""
    path = (
        Path(tempfile.gettempdir())
        / f"pvegpu-lab-pve-q35-4.0-{hashlib.sha256(PVE_Q35_CFG.encode()).hexdigest()[:12]}.cfg"
    )
    if not path.is_file():
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(PVE_Q35_CFG)
        partial.rename(path)
    return str(path)


@dataclass(frozen=True)
class Passthrough:
    """One vfio-pci device of the start: its id, qemu-server's `-device` value, the host function and what the
    node reports of it."""

    id: str
    device: str
    function: str
    vendor: str | None
    class_code: str | None
    root_port: str | None  # the extra `pcie-root-port` device its bus needs (hostpci4+), else None


def _split(value: str) -> tuple[str, dict[str, str]]:
    driver, _, rest = value.partition(",")
    return driver, parse_property_string(rest)


def _lab_cpu(value: str, host_phys_bits: int) -> tuple[str, str | None]:
    """The lab's `-cpu` value (module docstring) and guest-phys-bits' refusal, if any (QEMU 9.0's text)."""
    model, _, rest = value.partition(",")
    parts = [p for p in rest.split(",") if p]
    guest = next((p.split("=", 1)[1] for p in parts if p.startswith("guest-phys-bits=")), None)
    parts = [p for p in parts if not p.startswith("guest-phys-bits=")]
    refusal = None
    if guest is not None:
        options = dict(p.split("=", 1) for p in parts if "=" in p)
        if model == "host" or options.get("host-phys-bits") == "true":
            phys = host_phys_bits
        else:
            phys = int(options.get("phys-bits", TCG_PHYS_BITS))
        if not guest.isdigit():
            refusal = "Parameter 'guest-phys-bits' expects uint32_t"
        elif int(guest) and (int(guest) > phys or int(guest) < 32):
            refusal = f"guest-phys-bits should be between 32 and {phys}  (but is {guest})"
    return ",".join(["max" if model == "host" else model, *parts]), refusal


def _lab_machine(value: str, own_backend: bool) -> str:
    flags = [flag for flag in value.split(",") if not flag.startswith("type=")]
    machine = re.sub(r"\+pve\d+$", "", value.rsplit("type=", 1)[1].split(",", maxsplit=1)[0])
    version = re.search(r"(\d+)\.(\d+)$", machine)
    if version and (int(version.group(1)), int(version.group(2))) > LAB_QEMU:
        machine = "q35" if "q35" in machine else "pc"
    flags.append(f"type={machine}")
    return ",".join(flags + ([] if own_backend else [f"memory-backend={LAB_RAM}"]))


def _lab_memory(value: str) -> str:
    """RAM with reserve=off (the hugepages file backend too); virtiofs' memfd stays a shared memfd."""
    driver, options = _split(value)
    lab = {"id": options["id"], "size": options["size"], "reserve": "off"}
    if "host-nodes" in options:
        lab |= {"host-nodes": "0", "policy": options["policy"]}
    if driver == "memory-backend-memfd":
        return f"{driver}," + ",".join(f"{k}={v}" for k, v in (lab | {"share": options["share"]}).items())
    return "memory-backend-ram," + ",".join(f"{k}={v}" for k, v in lab.items())


@dataclass
class LabRun:
    """The first run's argv and what the vfio check runs need."""

    argv: list[str]
    passthrough: list[Passthrough]
    sets: dict[str, list[str]]  # stand-in id -> the `-set` values (verbatim) of vfio-only properties
    cpu_refusal: str | None
    originals: dict[str, str]  # `kvm: <option> <lab value>: ` -> the same with qemu-server's value
    sockets: dict[int, str]  # virtiofsN -> the lab's socket for qemu-server's
    socket_paths: dict[str, str]  # the lab's socket path -> qemu-server's

    def as_on_node(self, lines: list[str]) -> list[str]:
        """QEMU's lines with each option the lab replaced quoted as qemu-server wrote it, the stand-in
        device named as the device it stands for, and virtiofsd's sockets at qemu-server's paths."""
        quoted = [
            next((o + line[len(lab) :] for lab, o in self.originals.items() if line.startswith(lab)), line)
            for line in lines
        ]
        for lab, node in self.socket_paths.items():
            quoted = [line.replace(lab, node) for line in quoted]
        return [re.sub(rf"\b{STAND_IN}\b", "vfio-pci", line) for line in quoted]


def lab_run(  # noqa: PLR0912, PLR0915 (one branch per option the lab replaces)
    vmid: int,
    conf: Mapping[str, str],
    devices: Sequence[HostPci],
    host_phys_bits: int,
    sockets: str = VIRTIOFS_SOCKETS,
) -> LabRun:
    """The first run: qemu-server's parts with the lab's replacements (module docstring); `sockets` the
    directory of the lab's virtiofsd sockets."""
    parts = config_parts(vmid, conf, devices, firmware=LAB_FIRMWARE)
    info = {f: (d.vendors.get(f), d.classes.get(f)) for d in devices for f in d.functions}
    stand_in_props = device_properties(STAND_IN)
    numa = "-numa" in parts
    own_backend = numa or any("memory-backend=" in part for part in parts)  # virtiofs' (qemu_memory.py)
    socket_paths: dict[str, str] = {}
    lab_sockets: dict[int, str] = {}
    argv = ["kvm", *LAB_OPTIONS]
    passthrough: list[Passthrough] = []
    sets: dict[str, list[str]] = {}
    cpu_refusal = None
    originals: dict[str, str] = {}
    root_ports: dict[str, str] = {}
    i = 0
    while i < len(parts):
        option = parts[i]
        if option not in _TRANSFORMED or i + 1 == len(parts):
            argv.append(option)
            i += 1
            continue
        value = parts[i + 1]
        i += 2
        if option == "-cpu":
            value, cpu_refusal = _lab_cpu(value, host_phys_bits)
        elif option == "-m" and not own_backend:
            argv += ["-object", f"memory-backend-ram,id={LAB_RAM},size={value}M,reserve=off"]
        elif option == "-object" and value.startswith("memory-backend-"):
            value = _lab_memory(value)
        elif option == "-readconfig" and value == PVE_Q35_CFG_PATH:
            value = _q35_cfg()
        elif option == "-machine":
            value = _lab_machine(value, own_backend)
        elif option == "-device" and value.startswith("pcie-root-port,"):
            root_ports[_split(value)[1]["id"]] = value
        elif option == "-device" and value.startswith("vfio-pci,"):
            _, options = _split(value)
            function = options.get("host", options.get("sysfsdev", ""))
            vendor, class_code = info.get(function, (None, None))
            root_port = root_ports.get(options.get("bus", ""))
            passthrough.append(Passthrough(options["id"], value, function, vendor, class_code, root_port))
            kept = {k: v for k, v in options.items() if k in STAND_IN_KEYS or k in stand_in_props}
            value = ",".join([STAND_IN, *(f"{k}={v}" for k, v in kept.items())])
        elif option == "-chardev" and value.startswith("socket,id=virtiofs"):
            _, options = _split(value)
            index = int(options["id"].removeprefix("virtiofs"))
            lab_path = f"{sockets}/{options['path'].rsplit('/', 1)[1]}"
            socket_paths[lab_path] = options["path"]
            lab_sockets[index] = lab_path
            value = value.replace(f"path={options['path']}", f"path={lab_path}")
        elif option == "-set":
            group, _, rest = value.partition(".")
            target, _, assignment = rest.partition(".")
            prop = assignment.partition("=")[0]
            if group == "device" and any(p.id == target for p in passthrough) and prop not in stand_in_props:
                sets.setdefault(target, []).append(value)
                value = f"device.{target}.id={target}"
        if value != parts[i - 1]:
            originals[f"kvm: {option} {value}: "] = f"kvm: {option} {parts[i - 1]}: "
        argv += [option, value]
    return LabRun(argv, passthrough, sets, cpu_refusal, originals, lab_sockets, socket_paths)


def _run(argv: list[str]) -> tuple[int, list[str]]:
    done = subprocess.run(
        argv, executable=QEMU, input=QMP_QUIT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


def _vfio_argv(run: LabRun, device: Passthrough, machine: str) -> list[str]:
    """The check run of `device`: the machine, its buses, the real vfio-pci and its `-set` values."""
    argv = ["kvm", *LAB_OPTIONS, "-machine", machine, "-m", "64"]
    if "q35" in machine:
        argv += ["-readconfig", _q35_cfg()]
    else:
        argv += ["-device", "pci-bridge,id=pci.1,chassis_nr=1,bus=pci.0,addr=0x1e"]
        argv += ["-device", "pci-bridge,id=pci.2,chassis_nr=2,bus=pci.0,addr=0x1f"]
    if device.root_port:
        argv += ["-device", device.root_port]
    argv += ["-device", device.device]
    for value in run.sets.get(device.id, []):
        argv += ["-set", value]
    return argv


def _vfio_refusal(device: Passthrough, lines: list[str]) -> list[str] | None:
    """A check run's stderr: None when QEMU set every property and failed only at realize (`vfio ...`)."""
    prefix = f"kvm: -device {device.device}: "
    first = next((line for line in lines if line.startswith("kvm: ")), "")
    if first.startswith(prefix + "vfio "):
        return None
    return lines


def _clique_refusal(device: Passthrough, run: LabRun) -> str | None:
    """vfio_add_nv_gpudirect_cap's checks of a device with a clique (the last value set wins)."""
    _, options = _split(device.device)
    clique = options.get("x-nv-gpudirect-clique")
    for value in run.sets.get(device.id, []):
        assignment = value.split(".", 2)[2]
        if assignment.startswith("x-nv-gpudirect-clique="):
            clique = assignment.split("=", 1)[1]
    if clique is None:
        return None
    name = device.function.rsplit("/", 1)[-1]
    if device.vendor is None or int(device.vendor, 16) != NVIDIA:
        return f"kvm: -device {device.device}: vfio {name}: NVIDIA GPUDirect Clique ID: invalid device vendor"
    if device.class_code is None or int(device.class_code, 16) >> 16 != DISPLAY_CLASS:
        return f"kvm: -device {device.device}: vfio {name}: NVIDIA GPUDirect Clique ID: unsupported PCI class"
    return None


def host_phys_bits(cpuinfo: Path = Path("/proc/cpuinfo")) -> int:
    """The physical address bits of this machine's CPU (`address sizes : N bits physical`), which is the lab
    node's CPU; TCG's 40 when none is given."""
    match = re.search(r"^address sizes\s*:\s*(\d+) bits physical", cpuinfo.read_text(), re.MULTILINE)
    return int(match.group(1)) if match else TCG_PHYS_BITS


def _first_run(
    vmid: int,
    conf: Mapping[str, str],
    devices: Sequence[HostPci],
    phys_bits: int,
    shared_dirs: Mapping[int, str],
) -> tuple[LabRun, int, list[str]]:
    """The first run with a virtiofsd per virtiofsN on the lab's sockets (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="pvegpu-lab-virtiofsd-") as sockets:
        run = lab_run(vmid, conf, devices, phys_bits, sockets)
        missing = sorted(set(run.sockets) - set(shared_dirs))
        if missing:
            raise QemuCmdlineError(f"no shared directory resolved for 'virtiofs{missing[0]}'")
        windows = windows_version(conf.get("ostype")) > 0
        shares = [
            virtiofsd.Share(path, _virtiofs_options(conf[f"virtiofs{i}"]), shared_dirs[i], windows)
            for i, path in sorted(run.sockets.items())
        ]
        with virtiofsd.running(shares):
            status, lines = _run(run.argv)
    return run, status, lines


def _virtiofs_options(value: str) -> dict[str, str]:
    return parse_property_string(value, "dirid")


def verdict(
    vmid: int,
    conf: Mapping[str, str],
    devices: Sequence[HostPci],
    phys_bits: int | None = None,
    shared_dirs: Mapping[int, str] | None = None,
) -> list[str] | None:
    """None when QEMU accepts the start, else QEMU's stderr lines (the first is its error). `phys_bits`: the
    node CPU's physical address bits (guest-phys-bits' bound under the `host` model; None:
    host_phys_bits()); `shared_dirs`: each virtiofsN's directory on this machine (QemuCmdlineError when one
    is missing)."""
    bits = host_phys_bits() if phys_bits is None else phys_bits
    run, status, lines = _first_run(vmid, conf, devices, bits, shared_dirs or {})
    parsing = status != 0 and bool(lines) and lines[0].startswith("kvm: -set ")  # before any CPU is realized
    if run.cpu_refusal is not None and not parsing:
        return [f"kvm: {run.cpu_refusal}"]
    if status != 0:
        return run.as_on_node(lines) or [f"kvm: exited with code {status}"]
    machine = next(run.argv[i + 1] for i, a in enumerate(run.argv) if a == "-machine")
    machine = ",".join(f for f in machine.split(",") if f.startswith(("type=", "accel=")))
    # Devices with the same vfio-only properties get the same verdict: the first of each is run.
    checked: dict[tuple[str, ...], Passthrough] = {}
    kept = {*STAND_IN_KEYS, *VFIO_ONLY_KEYS, *device_properties(STAND_IN)}
    for device in run.passthrough:
        options = _split(device.device)[1]
        own = [f"{k}={v}" for k, v in sorted(options.items()) if k not in kept]
        signature = (*own, *(s.split(".", 2)[2] for s in run.sets.get(device.id, [])))
        if signature:
            checked.setdefault(signature, device)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(
            zip(
                checked.values(),
                pool.map(lambda d: _run(_vfio_argv(run, d, machine))[1], checked.values()),
                strict=True,
            )
        )
    for device in run.passthrough:  # in QEMU's order: the first device it cannot realize ends the start
        refusal = _vfio_refusal(device, results[device]) if device in results else None
        if refusal is not None:
            return refusal
        clique = _clique_refusal(device, run)
        if clique is not None:
            return [clique]
    return None
