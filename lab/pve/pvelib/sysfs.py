"""PVE::SysFSTools and qemu-server's PCI checks against the node's sysfs: a mapping's devices, a start's
passthrough devices (mapped or raw, with their alternatives), NUMA nodes and a CT's device nodes."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DieError
from .formats import DEV_FMT, HOSTPCI_FMT, NUMA_FMT
from .jsonschema import P, parse_boolean, parse_property_string
from .sectionconfig import Section, map_entry, mapping_state

if TYPE_CHECKING:
    from .rest import Call
    from .settings import Settings


def _attr(device: Path, name: str) -> str | None:
    try:
        return (device / name).read_text().strip()
    except OSError:
        return None


def pci_device_info(settings: Settings, address: str) -> dict[str, Any] | None:
    device = settings.sysfs_root / "bus/pci/devices" / address
    irq, vendor, dev = _attr(device, "irq"), _attr(device, "vendor"), _attr(device, "device")
    if irq is None or not irq.isdigit() or not vendor or not dev:
        return None
    if not vendor.startswith("0x") or not dev.startswith("0x"):
        return None
    info: dict[str, Any] = {"vendor": vendor, "device": dev}
    sub_vendor, sub_device = _attr(device, "subsystem_vendor"), _attr(device, "subsystem_device")
    if sub_vendor is not None and sub_device is not None:
        info["subsystem_vendor"], info["subsystem_device"] = sub_vendor, sub_device
    try:
        group = re.search(r"(\d+)$", os.readlink(device / "iommu_group"))
        info["iommugroup"] = int(group.group(1)) if group else None
    except OSError:
        info["iommugroup"] = None
    info["mdev"] = (device / "mdev_supported_types").is_dir() or (device / "nvidia").is_dir()
    return info


def assert_valid(settings: Settings, name: str, entry: dict[str, str], section: Section | None) -> None:
    """PVE::Mapping::PCI::assert_valid: raises DieError with Proxmox's text (ending in "\\n"). Each of the
    line's `;`-separated paths is checked (one device set: one alternative), the IOMMU group on the first."""
    for idx, path in enumerate(entry["path"].split(";")):
        address = path if "." in path else f"{path}.0"
        info = pci_device_info(settings, address)
        if info is None:
            raise DieError(f"pci device '{address}' not found\n")
        expected: dict[str, str] = {"id": f"{info['vendor']}:{info['device']}"}
        if info["iommugroup"] is not None:
            expected["iommugroup"] = str(info["iommugroup"])
        if "subsystem_vendor" in info:
            expected["subsystem-id"] = f"{info['subsystem_vendor']}:{info['subsystem_device']}"
        configured: dict[str, str] = {k: entry[k] for k in ("id", "iommugroup", "subsystem-id") if k in entry}
        if section is not None:
            expected["mdev"] = "1" if info["mdev"] else "0"
            configured["mdev"] = "1" if section.options.get("mdev") else "0"
        for key in sorted(set(expected) | set(configured)):
            if key == "iommugroup" and idx > 0:
                continue
            hw, cfg = expected.get(key), configured.get(key)
            if hw is None and cfg is None:
                continue
            if cfg is None:
                raise DieError(f"missing expected property '{key}' for device '{address}'\n")
            if hw is None:
                raise DieError(f"unexpected property '{key}' configured for device '{address}'\n")
            hw, cfg = hw.replace("0x", ""), cfg.replace("0x", "")
            if hw != cfg:
                raise DieError(f"'{key}' does not match for '{name}' ({hw} != {cfg})\n")


def slot_functions(settings: Settings, pci_id: str) -> list[str]:
    """SysFSTools::lspci($id): the functions whose address starts with `pci_id` (domain optional)."""
    full = pci_id if re.match(r"[a-f0-9]{4,}:[a-f0-9]{2}:", pci_id) else f"0000:{pci_id}"
    devices = settings.sysfs_root / "bus/pci/devices"
    names = sorted(p.name for p in devices.iterdir()) if devices.is_dir() else []
    if "." in full:
        return [n for n in names if n == full]
    return [n for n in names if n.startswith(full + ".")]


def passthrough_devices(call: Call, conf: dict[str, str]) -> list[dict[str, Any]]:
    """qemu-server's start-time hostpci handling: parse, resolve mappings (assert_valid), reserve."""
    settings = call.settings
    is_q35 = "q35" in conf.get("machine", "").split(",")[0]
    sections = {s.id: s for s in mapping_state(settings)[0]}
    keys = sorted((k for k in conf if re.fullmatch(r"hostpci\d+", k)), key=lambda k: int(k[7:]))
    if keys and not any((settings.sysfs_root / "class/iommu").glob("*")):
        raise DieError("cannot prepare PCI pass-through, IOMMU not present\n")
    parsed: list[tuple[str, bool, list[list[str]]]] = []
    for key in keys:
        entry = parse_property_string(P(props=HOSTPCI_FMT, default_key="host"), conf[key])
        if "host" in entry and "mapping" in entry:
            raise DieError("Cannot set both 'host' and 'mapping'.\n")
        if "host" not in entry and "mapping" not in entry:
            raise DieError("Either 'host' or 'mapping' must be set.\n")
        pcie = parse_boolean(entry.get("pcie", "0")) == 1
        if pcie and not is_q35:
            raise DieError("q35 machine model is not enabled\n")
        alternatives: list[list[str]] = []
        if "mapping" in entry:
            name = entry["mapping"]
            section = sections.get(name)
            lines = [map_entry(m) for m in section.map] if section else []
            mine = [m for m in lines if m.get("node") == settings.node]
            if not mine:
                raise DieError(f"PCI device mapping not found for '{name}'\n")
            for line in mine:
                try:
                    assert_valid(settings, name, line, section)
                except DieError as error:
                    raise DieError(
                        f"PCI device mapping invalid (hardware probably changed): {error.text}\n"
                    ) from None
                alternatives.append(line["path"].split(";"))
        else:
            alternatives.append(entry["host"].split(";"))
        parsed.append((key, pcie, [_alternative_functions(settings, paths) for paths in alternatives]))
    used: set[str] = set()
    devices = []
    for key, pcie, options in parsed:
        functions = _chosen(key, options, used)
        sysfs = settings.sysfs_root / "bus/pci/devices"
        devices.append(
            {
                "hostpci": int(key[7:]),
                "pcie": pcie,
                "functions": functions,
                # for the lab's QEMU check of vfio's clique rule (lab/pve/qemu_check.py)
                "vendors": {f: _attr(sysfs / f, "vendor") for f in functions},
                "classes": {f: _attr(sysfs / f, "class") for f in functions},
            }
        )
    return devices


def _alternative_functions(settings: Settings, paths: list[str]) -> list[str]:
    """PCI.pm parse_hostpci: an alternative (one map line, or `host`) is every function of ALL its
    `;`-separated paths, passed together (the node's map lines are the alternatives)."""
    functions: list[str] = []
    for path in paths:
        found = slot_functions(settings, path)
        if not found:
            raise DieError(f"no PCI device found for '{path}'\n")
        functions += found
    return functions


def _chosen(key: str, options: list[list[str]], used: set[str]) -> list[str]:
    """PCI.pm choose_hostpci_devices: the only alternative, or the first whose functions are all free;
    the chosen functions join `used`."""
    if len(options) == 1:
        taken = next((function for function in options[0] if function in used), None)
        if taken is not None:
            raise DieError(f"device '{taken}' assigned more than once\n")
        chosen = options[0]
    else:
        free = [option for option in options if not used.intersection(option)]
        if not free:
            raise DieError(f"could not find a free device for '{key}'\n")
        chosen = free[0]
    used.update(chosen)
    return chosen


def numa_nodes(settings: Settings, conf: dict[str, str]) -> None:
    """qemu-server Memory.pm `config`'s custom NUMA checks at start, after the hostpci ones (config_to_command
    order): each numaN needs memory and cpus; hostnodes must exist on the node (its sysfs node directories)
    and need a policy; the nodes' memory must add up to the VM's. Hugepages are not allocated here."""
    if parse_boolean(conf.get("numa", "0")) != 1:
        return
    total = 0.0
    for index in range(8):
        if not conf.get(f"numa{index}"):
            continue
        numa = parse_property_string(P(props=NUMA_FMT), conf[f"numa{index}"])
        if not numa.get("memory") or float(numa["memory"]) == 0:
            raise DieError(f"missing NUMA node{index} memory value\n")
        total += float(numa["memory"])
        if "cpus" not in numa:
            raise DieError(f"missing NUMA node{index} cpus\n")
        if "hostnodes" in numa:
            printed = numa["hostnodes"].replace(";", ",")
            for part in numa["hostnodes"].split(";"):
                first, _, last = part.partition("-")
                for node in range(int(first), int(last or first) + 1):
                    if not (settings.sysfs_root / f"devices/system/node/node{node}").is_dir():
                        raise DieError(f"host NUMA node{node} doesn't exist\n")
            if "policy" not in numa:
                raise DieError(f"you need to define a policy for hostnode {printed}\n")
    memory = float(conf.get("memory", "512").split(",")[0].removeprefix("current="))
    if total and total != memory:
        raise DieError("total memory for NUMA nodes must be equal to vm static memory\n")


def check_device(settings: Settings, value: str) -> None:
    entry = parse_property_string(P(props=DEV_FMT, default_key="path"), value)
    path = entry.get("path", "")
    if not path.startswith("/dev/") or "/." in path:
        raise DieError(f"{path} is not a valid device path\n")
    try:
        mode = settings.path(path).stat().st_mode
    except FileNotFoundError:
        raise DieError(f"Device {path} does not exist\n") from None
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
        raise DieError(f"{path} is not a device\n")
