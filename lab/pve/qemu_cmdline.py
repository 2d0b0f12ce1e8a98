"""A lab VM start's QEMU command line: the parts a VM's config decides, built as qemu-server builds them (for
real QEMU's verdict on them: lab/pve/qemu_check.py). LAB STAND-IN for the `kvm` process a Proxmox node starts;
this is NOT Proxmox.

`config_parts(vmid, conf, devices)` builds qemu-server 9.2's argv parts (src/PVE/QemuServer.pm
config_to_command), in its order: the OVMF pflash drives (OVMF.pm print_ovmf_commandline: the CODE image
get_ovmf_files picks; the vars drive is the lab's, firmware_parts), `-smp`, `-cpu` (CPUConfig.pm
get_cpu_options), `-m` and the NUMA objects (Memory.pm config), `-readconfig` pve-q35-4.0.cfg (q35) and the
i440fx PCI bridges, the hostpci devices with their extra root ports (PCI.pm print_hostpci_devices: id
`hostpciN`, or `hostpciN.J` for function J of a multifunction slot, `.0` with `multifunction=on`), the
virtiofsN sockets and devices (Virtiofs.pm config; their shared memory is Memory.pm's: qemu_memory.py),
`-machine` (its flags and `type=`), and `args` last (PVE::Tools::split_args). Its pieces: qemu_config.py (the
config's values, the machine), qemu_memory.py, qemu_q35_cfg.py. Nothing else qemu-server prints (QMP
sockets, disks, NICs, VGA, USB, balloon, -global, -rtc, taskset for `affinity`) is built; not modelled either:
memory and CPU hotplug, custom CPU models, Windows 7's PCIe addresses, vIOMMU, SEV/TDX, legacy IGD, a
hostpci's `bootindex` (`boot: order=`), x-vga's Hyper-V vendor id, the `+pveN` revision a feature may require
(always `+pve0`), CPU vendors beyond a small table (_DEFAULT_VENDOR_MODELS, _AMD_MODELS).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lab.pve.qemu_config import (
    NODE_QEMU,
    Machine,
    QemuCmdlineError,
    as_bool,
    parse_property_string,
    vm_machine,
    windows_version,
)
from lab.pve.qemu_memory import memory_parts
from lab.pve.qemu_q35_cfg import PVE_Q35_CFG_PATH

PVE_FIRMWARE = "/usr/share/pve-edk2-firmware/"  # OVMF.pm $EDK2_FW_BASE
MAX_HOSTPCI = 16  # PCI.pm $MAX_HOSTPCI_DEVICES
MAX_VIRTIOFS = 10  # Virtiofs.pm $MAX_VIRTIOFS
VIRTIOFS_SOCKETS = "/run/qemu-server/virtiofsd"  # Virtiofs.pm $socket_path_root

# PCI.pm get_pci_addr_map (the hostpci entries) and get_pcie_addr_map, print_pcie_root_port.
_PCI_ADDR = {0: (0, 16), 1: (0, 17), 2: (0, 27), 3: (0, 28)} | {i: (2, 9 + i) for i in range(4, MAX_HOSTPCI)}
_ROOT_PORT_ADDR = {i: f"{0x10 + (i - 4) // 8:x}.{(i - 4) % 8}" for i in range(4, MAX_HOSTPCI)}
# CPUConfig.pm: models whose vendor is not 'default' get `vendor=`; the lab knows these models' vendors.
_DEFAULT_VENDOR_MODELS = {"host", "max", "kvm32", "kvm64", "qemu32", "qemu64"}
_AMD_MODELS = re.compile(r"(?i)(epyc|opteron|phenom|athlon)")


@dataclass(frozen=True)
class HostPci:
    """A hostpciN as the start resolved it: the host functions chosen (all functions of the slot for a
    function-less path) and, for the lab's clique check, each function's vendor and class (sysfs `vendor`,
    `class`: `0x10de`, `0x030000`)."""

    index: int
    functions: tuple[str, ...]
    vendors: Mapping[str, str] = field(default_factory=dict)
    classes: Mapping[str, str] = field(default_factory=dict)


# --- -cpu: CPUConfig.pm get_cpu_options --------------------------------------------------------------------


@dataclass
class _Flag:
    op: str = ""
    value: str | None = None


def _hyperv_flags(winversion: int, machine: Machine, bios: str | None) -> dict[str, _Flag]:
    """CPUConfig.pm get_hyperv_enlightenments (without a GPU passed with x-vga or an hv-vendor-id)."""
    if winversion < 6 or (bios == "ovmf" and winversion < 8):
        return {}
    flags: dict[str, _Flag] = {}
    if machine.at_least(2, 3):
        flags |= {"hv_spinlocks": _Flag(value="0x1fff"), "hv_vapic": _Flag(), "hv_time": _Flag()}
    else:
        flags["hv_spinlocks"] = _Flag(value="0xffff")
    if machine.at_least(2, 6):
        flags |= {"hv_reset": _Flag(), "hv_vpindex": _Flag(), "hv_runtime": _Flag()}
    if winversion >= 7:
        flags["hv_relaxed"] = _Flag()
        if machine.at_least(2, 12):
            flags |= {"hv_synic": _Flag(), "hv_stimer": _Flag()}
        if machine.at_least(3, 1):
            flags["hv_ipi"] = _Flag()
    return flags


def _pve_flags(conf: Mapping[str, str], model: str, machine: Machine, kvm: bool) -> dict[str, _Flag]:
    """CPUConfig.pm get_pve_cpu_flags (for QEMU before 11.0)."""
    flags: dict[str, _Flag] = {}
    if model == "kvm64":
        flags["lahf_lm"] = _Flag("+")
    if conf.get("ostype") == "solaris":
        flags["x2apic"] = _Flag("-")
    if model in ("kvm64", "kvm32"):
        flags["sep"] = _Flag("+")
    if model.startswith("Opteron"):
        flags["rdtscp"] = _Flag("-")
    if machine.at_least(2, 3) and kvm:
        flags |= {"kvm_pv_unhalt": _Flag("+"), "kvm_pv_eoi": _Flag("+")}
    return flags


def _forced_flags(model: str, kvm: bool, kvm_off: bool) -> dict[str, _Flag]:
    """get_cpu_options' `$pve_forced_flags`: enforce, kvm=off (hidden), the model's vendor."""
    flags: dict[str, _Flag] = {}
    if model != "host" and kvm:
        flags["enforce"] = _Flag()
    if kvm_off:
        flags["kvm"] = _Flag(value="off")
    if model not in _DEFAULT_VENDOR_MODELS and not model.startswith("x86-64-v"):
        flags["vendor"] = _Flag(value="AuthenticAMD" if _AMD_MODELS.match(model) else "GenuineIntel")
    return flags


def _phys_bits(cpu: Mapping[str, str]) -> str:
    text = ""
    for option in ("guest-phys-bits", "phys-bits"):
        value = cpu.get(option)
        if value == "host":
            if option == "guest-phys-bits":
                raise QemuCmdlineError("unexpected value 'host' for guest-phys-bits")
            text += ",host-phys-bits=true"
        elif value:
            text += f",{option}={value}"
    return text


def cpu_option(conf: Mapping[str, str], machine: Machine, kvm: bool, kvm_off: bool) -> str:
    """The `-cpu` value: the model, `level`, the resolved flags sorted by name (`<op><name>[=<value>]`; a
    later layer overrides: PVE's, Hyper-V's, the VM's `flags`, the forced ones), then guest-phys-bits and
    phys-bits (`host`: host-phys-bits=true)."""
    cpu = parse_property_string(conf.get("cpu", ""), "cputype")
    model = cpu.get("cputype") or ("kvm64" if kvm else "qemu64")
    if model.startswith("custom-"):
        raise QemuCmdlineError(f"custom CPU model '{model}' is not modelled")
    if "hidden" in cpu:
        kvm_off = as_bool(cpu["hidden"], False)
    vm_flags: dict[str, _Flag] = {}
    for flag in cpu.get("flags", "").split(";") if cpu.get("flags") else []:
        match = re.fullmatch(r"([+-])([a-zA-Z0-9\-_\.]+)", flag)
        if match:
            vm_flags[match.group(2)] = _Flag(match.group(1))
    hyperv = _hyperv_flags(windows_version(conf.get("ostype")), machine, conf.get("bios")) if kvm else {}
    resolved = _pve_flags(conf, model, machine, kvm) | hyperv | vm_flags | _forced_flags(model, kvm, kvm_off)
    text = model + (f",level={cpu['level']}" if "level" in cpu else "")
    text += "".join(
        f",{f.op}{name}" + (f"={f.value}" if f.value else "") for name, f in sorted(resolved.items())
    )
    return text + _phys_bits(cpu)


# --- hostpci: PCI.pm print_hostpci_devices ----------------------------------------------------------------


def hostpci_parts(
    vmid: int, conf: Mapping[str, str], devices: Sequence[HostPci], machine: Machine
) -> list[str]:
    """The `-device` parts of every hostpciN in index order: an extra `pcie-root-port` before hostpci4+ with
    `pcie=1` (the q35 config has ports 1-4), then one vfio-pci per function."""
    chosen = {device.index: device for device in devices}
    parts: list[str] = []
    for index in range(MAX_HOSTPCI):
        key = f"hostpci{index}"
        if not conf.get(key):
            continue
        if index not in chosen:
            raise QemuCmdlineError(f"no host functions resolved for '{key}'")
        options = parse_property_string(conf[key], "host")
        pcie = as_bool(options.get("pcie"), False)
        if pcie and not machine.q35:
            raise QemuCmdlineError("q35 machine model is not enabled")
        if pcie:
            if index > 3:
                port = index + 1
                parts += [
                    "-device",
                    f"pcie-root-port,id=ich9-pcie-port-{port},addr={_ROOT_PORT_ADDR[index]},x-speed=16,"
                    f"x-width=32,multifunction=on,bus=pcie.0,port={port},chassis={port}",
                ]
            pciaddr = f",bus=ich9-pcie-port-{index + 1},addr=0x0"
        else:
            bus, addr = _PCI_ADDR[index]
            pciaddr = f",bus=pci.{bus},addr={addr:#x}"
        functions = chosen[index].functions
        mdev = options.get("mdev")
        multifunction = len(functions) > 1 and not mdev
        for j, function in enumerate(functions):
            device = "vfio-pci"
            device += (
                f",sysfsdev=/sys/bus/mdev/devices/{index:08d}-0000-0000-0000-{vmid:012d}"
                if mdev
                else f",host={function}"
            )
            mf_addr = f".{j}" if multifunction else ""
            device += f",id={key}{mf_addr}{pciaddr}{mf_addr}"
            parts += ["-device", device + (_first_function(conf, options, multifunction) if j == 0 else "")]
            if mdev:
                break
    return parts


def _first_function(conf: Mapping[str, str], options: Mapping[str, str], multifunction: bool) -> str:
    """What print_hostpci_devices adds to a slot's first function: rombar=0, x-vga (not with OVMF),
    multifunction=on, romfile, the x-pci-* id overrides."""
    text = ",rombar=0" if "rombar" in options and not as_bool(options["rombar"], True) else ""
    text += ",x-vga=on" if as_bool(options.get("x-vga"), False) and conf.get("bios") != "ovmf" else ""
    text += ",multifunction=on" if multifunction else ""
    text += f",romfile=/usr/share/kvm/{options['romfile']}" if options.get("romfile") else ""
    for option in ("vendor-id", "device-id", "sub-vendor-id", "sub-device-id"):
        text += f",x-pci-{option}={options[option]}" if options.get(option) else ""
    return text


def _kvm_off(conf: Mapping[str, str]) -> bool:
    """print_hostpci_devices' `$kvm_off`: a GPU passed with x-vga hides KVM."""
    return any(
        as_bool(parse_property_string(conf[f"hostpci{i}"], "host").get("x-vga"), False)
        for i in range(MAX_HOSTPCI)
        if conf.get(f"hostpci{i}")
    )


# --- firmware: OVMF.pm ------------------------------------------------------------------------------------


def ovmf_files(conf: Mapping[str, str], q35: bool) -> tuple[str, str]:
    """OVMF.pm get_ovmf_files (x86_64, no confidential VM): the CODE and VARS image names."""
    efidisk = parse_property_string(conf.get("efidisk0", ""), "file")
    if efidisk.get("efitype") == "4m":
        code = "OVMF_CODE_4M.secboot.fd" if q35 else "OVMF_CODE_4M.fd"
        return code, "OVMF_VARS_4M.ms.fd" if as_bool(
            efidisk.get("pre-enrolled-keys"), False
        ) else "OVMF_VARS_4M.fd"
    return "OVMF_CODE.fd", "OVMF_VARS.fd"


def firmware_parts(conf: Mapping[str, str], machine: Machine, firmware: str) -> tuple[list[str], list[str]]:
    """With `bios: ovmf`: the pflash drives (machine 10.0+: `-blockdev` + `pflash0=`/`pflash1=` machine flags,
    else `-drive if=pflash`) and the machine flags. The vars drive is the lab's (module docstring)."""
    if conf.get("bios") != "ovmf":
        return [], []
    code, vars_ = ovmf_files(conf, machine.q35)
    base = firmware.rstrip("/") + "/"
    if machine.at_least(10, 0):
        code_dev = {
            "driver": "raw",
            "file": {"driver": "file", "filename": base + code},
            "node-name": "pflash0",
            "read-only": True,
        }
        vars_dev = {
            "driver": "raw",
            "file": {"driver": "file", "filename": base + vars_},
            "node-name": "drive-efidisk0",
            "read-only": True,
        }
        dump = functools.partial(json.dumps, sort_keys=True, separators=(",", ":"))
        return ["-blockdev", dump(code_dev), "-blockdev", dump(vars_dev)], [
            "pflash0=pflash0",
            "pflash1=drive-efidisk0",
        ]
    return [
        "-drive",
        f"if=pflash,unit=0,format=raw,readonly=on,file={base}{code}",
        "-drive",
        f"if=pflash,unit=1,id=drive-efidisk0,format=raw,readonly=on,file={base}{vars_}",
    ], []


# --- virtiofs: Virtiofs.pm config ---------------------------------------------------------------------------


def virtiofs_enabled(conf: Mapping[str, str]) -> bool:
    """Virtiofs.pm virtiofs_enabled: any virtiofsN set."""
    return any(conf.get(f"virtiofs{i}") for i in range(MAX_VIRTIOFS))


def virtiofs_parts(vmid: int, conf: Mapping[str, str]) -> list[str]:
    """Each virtiofsN's vhost-user socket (virtiofsd's, Virtiofs.pm start_virtiofsd) and its
    `vhost-user-fs-pci` device, the mapping id its mount tag; queue-size 1024 as upstream (a Windows guest
    bug). The mapping's checks are the stand-in's (pvelib/mapping_dir.py virtiofs_dirs)."""
    parts: list[str] = []
    for index in range(MAX_VIRTIOFS):
        if not conf.get(f"virtiofs{index}"):
            continue
        dirid = parse_property_string(conf[f"virtiofs{index}"], "dirid").get("dirid", "")
        parts += ["-chardev", f"socket,id=virtiofs{index},path={VIRTIOFS_SOCKETS}/vm{vmid}-fs{index}"]
        parts += ["-device", f"vhost-user-fs-pci,queue-size=1024,chardev=virtiofs{index},tag={dirid}"]
    return parts


# --- the whole ----------------------------------------------------------------------------------------------


def config_parts(
    vmid: int,
    conf: Mapping[str, str],
    devices: Sequence[HostPci],
    kvm_version: tuple[int, int] = NODE_QEMU,
    firmware: str = PVE_FIRMWARE,
) -> list[str]:
    """qemu-server's argv parts for `conf` (module docstring), `devices` the hostpciN functions chosen."""
    machine = vm_machine(conf, kvm_version)
    kvm = as_bool(conf.get("kvm"), True)
    parts, machine_flags = firmware_parts(conf, machine, firmware)
    sockets = int(conf.get("sockets") or conf.get("smp") or 1)
    cores = int(conf.get("cores") or 1)
    maxcpus = sockets * cores
    vcpus = int(conf.get("vcpus") or maxcpus)
    parts += ["-smp", f"{vcpus},sockets={sockets},cores={cores},maxcpus={maxcpus}"]
    winversion = windows_version(conf.get("ostype"))
    if winversion >= 6 or (conf.get("ostype") == "l26" and machine.at_least(10, 1)):
        machine_flags.append("hpet=off")  # Cfg2Cmd/Timer.pm
    parts += ["-cpu", cpu_option(conf, machine, kvm, _kvm_off(conf))]
    memory, memory_flags = memory_parts(conf, sockets, cores, virtiofs_enabled(conf))
    parts += memory
    machine_flags += memory_flags
    devices_parts: list[str] = []
    if machine.q35:
        devices_parts += ["-readconfig", PVE_Q35_CFG_PATH]
    elif machine.at_least(2, 3):  # config_to_command: i440fx gets pci.1 and pci.2 first
        devices_parts += ["-device", "pci-bridge,id=pci.1,chassis_nr=1,bus=pci.0,addr=0x1e"]
        devices_parts += ["-device", "pci-bridge,id=pci.2,chassis_nr=2,bus=pci.0,addr=0x1f"]
    devices_parts += hostpci_parts(vmid, conf, devices, machine)
    devices_parts += virtiofs_parts(vmid, conf)  # config_to_command: the last devices
    parts += devices_parts
    if not kvm:
        machine_flags.append("accel=tcg")
    machine_flags.append(f"type={machine.type}+pve0")
    parts += ["-machine", ",".join(machine_flags)]
    parts += shlex.split(conf.get("args", ""))  # PVE::Tools::split_args: Text::ParseWords::shellwords
    return parts
