"""Proxmox's answers to three reads, computed from the config files the node's one read brings (its `pve`
part, pvegpu/facts/node_read.py), so that a no-op run need not ask the API for them (a `pvesh` each):

- `qemu_config_answer(raw)`: `GET /nodes/{node}/qemu/{vmid}/config` of `/etc/pve/qemu-server/<vmid>.conf`,
  as qemu-server's `parse_vm_config` and the API's `vm_config` give it: the main section's keys, integers
  and booleans as numbers (the config schema's types), `#` lines and `description:` as `description`
  (percent-decoded), `cipassword` masked, `digest` the sha1 of the file;
- `storage_answer(raw, storage)`: `GET /storage/{storage}` of `/etc/pve/storage.cfg` (PVE::SectionConfig,
  pve-storage's `parse_config` and `api_storage_config`): `storage`, `type`, `content`, `path`, `digest`;
- `mappings_answer(raw, node, hardware)`: `GET /cluster/mapping/pci?check-node={node}` of
  `/etc/pve/mapping/pci.cfg` (pvegpu/facts/pci_cfg.py, Proxmox's own reading of it) with each mapping's
  `checks`: `No mapping for node <node>.` where the node has no map line, and none where each of its lines
  passes Proxmox's live check (PVE::Mapping::PCI `assert_valid`) against the node's PCI hardware, read in
  the same command.

- `qemu_status_answer(raw, process, vmid)`: `GET /nodes/{node}/qemu/{vmid}/status/current` as far as pvegpu
  reads it (`vmid`, `status`, `name`), from the VM's config file and its QEMU process as the node shows it
  (`qemu_running`: qemu-server's `check_running`).

Each returns None where Proxmox's answer could differ in a way this does not model, and the API is asked
then: pending changes (the API applies them), a key the schema does not have or a value its type refuses
(Proxmox drops them with a warning), a drive given as a path (Proxmox rewrites it to a volume id), a
storage Proxmox supplies or overrides (`local`: pve-storage's own defaults), a type other than `dir`, a
content list it would change; a map line of the node that would fail the live check (Proxmox's message is
wanted then) or whose outcome the hardware read cannot prove (a device not on vfio-pci, whose mdev types
are not read; a mapping with `mdev`). Writes still go through the API, with these answers' digests: a file
changed since is refused by Proxmox, as after a read through the API.
"""

from __future__ import annotations

import hashlib
import re

from pvegpu.facts import section_config
from pvegpu.facts.pci_cfg import parse_pci_cfg
from pvegpu.models.hardware import HostHardware
from pvegpu.models.pve import QEMU_RUN_DIR, MapEntry, MapEntryError, PciMapping, QemuProcess, parse_map_entry

# qemu-server's config schema ($confdesc, $confdesc_cloudinit, the indexed device keys; src/PVE/QemuServer.pm
# at e6352be): the keys the API returns, and the ones typed as numbers in its answer.
BOOLEAN_KEYS = frozenset({
    "acpi", "allow-ksm", "autostart", "ciupgrade", "freeze", "keephugepages", "kvm", "localtime", "numa",
    "onboot", "protection", "reboot", "tablet", "tdf", "template",
})  # fmt: skip
INTEGER_KEYS = frozenset({
    "balloon", "cores", "cpuunits", "migrate_speed", "shares", "smp", "snaptime", "sockets", "vcpus",
})  # fmt: skip
STRING_KEYS = frozenset({
    "affinity", "agent", "amd-sev", "arch", "args", "audio0", "bios", "boot", "bootdisk", "cicustom",
    "cipassword", "citype", "ciuser", "cpu", "hookscript", "hotplug", "hugepages", "intel-tdx", "ivshmem",
    "keyboard", "lock", "machine", "memory", "meta", "name", "nameserver", "ostype", "parent", "rng0",
    "runningcpu", "runningmachine", "running-nets-host-mtu", "scsihw", "searchdomain", "smbios1",
    "spice_enhancements", "sshkeys", "startdate", "startup", "tags", "vga", "vmgenid", "vmstate",
    "vmstatestorage", "watchdog",
})  # fmt: skip
_INDEXED = re.compile(
    r"hostpci(1[0-5]|\d)|(net|ipconfig)([12]?\d|3[01])|numa[0-7]|usb(1[0-3]|\d)|serial[0-3]|parallel[0-2]"
    r"|virtiofs\d"
)
_DRIVE = re.compile(r"ide[0-3]|scsi([12]?\d|30)|virtio(1[0-5]|\d)|sata[0-5]|efidisk0|tpmstate0|unused\d{1,3}")
# Number-typed keys (cpulimit, migrate_downtime) and the renamed `cdrom` are not modelled: the API is asked.
_LINE = re.compile(r"([a-z][a-z_\-]*\d*):\s*(.+?)\s*")
_SECTION = re.compile(r"\[([^\]]*)\]\s*")
_PENDING = re.compile(r"\[PENDING\]\s*", re.IGNORECASE)
_TRUE = re.compile(r"1|on|yes|true", re.IGNORECASE)
_FALSE = re.compile(r"0|off|no|false", re.IGNORECASE)
_INTEGER = re.compile(r"[+-]?\d+")
_PERCENT = re.compile(rb"%([0-9a-fA-F]{2})")
MASKED = "**********"

# pve-storage (src/PVE/Storage/Plugin.pm, DirPlugin.pm): what a `dir` storage may hold.
DIR_CONTENT = frozenset({"images", "rootdir", "vztmpl", "iso", "backup", "snippets", "import"})
LOCAL = "local"
_CONFIG_ID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE)


def qemu_config_answer(raw: bytes) -> dict[str, object] | None:
    """The API's answer for the VM config file `raw` (module docstring); None where it is not modelled."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    lines = [line for line in text.split("\n") if line.strip()]
    if any(_PENDING.fullmatch(line) for line in lines):
        return None
    values: dict[str, object] = {}
    description: str | None = None
    for line in lines:
        if _SECTION.fullmatch(line):
            break  # snapshots and special sections: not part of the current config
        if line.startswith("#"):
            description = (description or "") + _decoded(line[1:]) + "\n"
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            continue  # Proxmox warns and skips it
        key, value = match[1], match[2]
        if key == "description":
            description = (description or "") + _decoded(value)
        elif key == "delete":
            continue  # only allowed in [PENDING]: Proxmox warns and skips it
        else:
            typed = _typed(key, value)
            if typed is None:
                return None
            values[key] = typed
    if description is not None:
        values["description"] = description.rstrip()
    if values.get("cipassword"):
        values["cipassword"] = MASKED
    return {**values, "digest": hashlib.sha1(raw).hexdigest()}


def _typed(key: str, value: str) -> object | None:
    """`value` as the API returns it for `key`; None for what is not modelled."""
    if key in BOOLEAN_KEYS:
        return 1 if _TRUE.fullmatch(value) else 0 if _FALSE.fullmatch(value) else None
    if key in INTEGER_KEYS:
        return _integer(value)
    if key in STRING_KEYS or _INDEXED.fullmatch(key):
        return value
    if _DRIVE.fullmatch(key):
        return None if value.startswith("/") else value  # a path: Proxmox gives its volume id
    return None


def _integer(value: str) -> int | None:
    """An integer's value; None for what is no integer, or too long for Python to read (beyond any limit of
    the schema's, where Proxmox refuses it)."""
    if not _INTEGER.fullmatch(value):
        return None
    try:
        return int(value)
    except ValueError:  # more digits than int() reads (sys.get_int_max_str_digits)
        return None


def _decoded(text: str) -> str:
    """PVE::Tools::decode_text: `%XX` escapes, then UTF-8."""
    return _PERCENT.sub(lambda m: bytes([int(m[1], 16)]), text.encode()).decode(errors="replace")


def storage_answer(raw: bytes, storage: str) -> dict[str, object] | None:
    """The API's answer for `storage` in storage.cfg `raw` (module docstring); None where not modelled."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    sections = _storage_sections(text)
    found = sections.get(storage)
    if found is None:
        return None
    kind, options = found
    path, content = options.get("path"), options.get("content")
    # `shared`: the API's answer carries it as a boolean, which the hook's storage check reads from the API
    if kind != "dir" or path is None or content is None or "nodes" in options or "shared" in options:
        return None
    if storage == LOCAL and path != "/var/lib/vz":
        return None  # pve-storage replaces such a `local` with its own
    types = [item for item in re.split(r"[,;\s]+", content) if item]
    if not types or not set(types) <= DIR_CONTENT:
        return None
    return {
        "storage": storage,
        "type": kind,
        "path": path,
        "content": ",".join(dict.fromkeys(types)),
        "digest": hashlib.sha1(raw).hexdigest(),
    }


def _storage_sections(text: str) -> dict[str, tuple[str, dict[str, str]]]:
    """PVE::SectionConfig's reading of storage.cfg (facts/section_config.py): `type: id` headers, indented
    `key value` lines up to an empty line, `#` lines skipped; a repeated key keeps its first value, a key
    without a value is left out, a repeated id keeps its last section. Sections with an invalid id are left
    out."""
    sections: dict[str, tuple[str, dict[str, str]]] = {}
    for item in section_config.read_sections(text):
        if isinstance(item, section_config.Section) and _CONFIG_ID.fullmatch(item.header[2]):
            options, _ = section_config.properties(item, _storage_value)
            sections[item.header[2]] = (item.header[1], options)
    return sections


def _storage_value(key: str, value: str | None) -> str:
    if value is None:
        raise section_config.SectionValueError(f"no value for '{key}'")
    return value


def mappings_answer(raw: bytes, node: str, hardware: HostHardware) -> list[dict[str, object]] | None:
    """The API's answer for the PCI mappings in pci.cfg `raw`, checked on `node` with `hardware` (module
    docstring); None where not modelled."""
    try:
        cfg = parse_pci_cfg(raw.decode())
    except UnicodeDecodeError:
        return None
    digest = hashlib.sha1(raw).hexdigest()
    answer: list[dict[str, object]] = []
    for mapping in cfg.mappings:  # sections that failed to parse are not listed
        checks = _checks(mapping, node, hardware)
        if checks is None:
            return None
        answer.append({**_section(mapping), "id": mapping.id, "digest": digest, "checks": checks})
    return answer


def _section(mapping: PciMapping) -> dict[str, object]:
    section: dict[str, object] = {"type": "pci", "map": list(mapping.map)}
    if mapping.description is not None:
        section["description"] = mapping.description
    for key, flag in (("mdev", mapping.mdev), ("live-migration-capable", mapping.live_migration_capable)):
        if flag is not None:
            section[key] = int(flag)
    return section


def _checks(mapping: PciMapping, node: str, hardware: HostHardware) -> list[dict[str, str]] | None:
    """[] when every map line of `node` passes the live check, the warning when there is none; None when
    a line fails it or the outcome is not proven."""
    try:
        entries = [entry for entry in map(parse_map_entry, mapping.map) if entry.node == node]
    except MapEntryError:
        return None  # the parser kept only valid sections: not reached
    if not entries:
        return [{"severity": "warning", "message": f"No mapping for node {node}."}]
    if mapping.mdev:
        return None
    return [] if all(_passes(entry, hardware) for entry in entries) else None


def _passes(entry: MapEntry, hardware: HostHardware) -> bool:
    """Whether `assert_valid` passes for `entry`, proven from `hardware`: each path's function (`.0` for a
    whole device) is there, on vfio-pci (so no mdev types), with the entry's id and subsystem-id, and the
    first path in the entry's IOMMU group."""
    for index, path in enumerate(entry.path.split(";")):
        function = hardware.by_address.get(path if "." in path.rpartition(":")[2] else f"{path}.0")
        if function is None or function.driver != "vfio-pci":
            return False
        if (entry.id, entry.subsystem_id) != (
            f"{function.vendor}:{function.device}",
            f"{function.subsystem_vendor}:{function.subsystem_device}",
        ):
            return False
        if index == 0 and (function.iommu_group is None or entry.iommugroup != function.iommu_group):
            return False
    return True


_QEMU_COMMAND = re.compile(rb"kvm$|(?:^|/)qemu-[^/]+$")
_OPTION = re.compile(rb"--?(.*)", re.DOTALL)


def qemu_running(process: QemuProcess, vmid: int) -> bool:
    """Whether qemu-server counts VM `vmid` as running on the node (PVE::QemuServer::Helpers
    `vm_running_locally` -> `instance_running_locally`, with `parse_cmdline` and PVE::ProcFSTools
    `check_process_running`): the pidfile's first line is a PID whose command line (up to its first newline,
    split at NUL) is a `kvm` or `qemu-*` command naming that pidfile after `-pidfile`, and whose process is
    no zombie."""
    if process.pidfile is None or process.cmdline is None or process.state in (None, "Z"):
        return False
    if re.fullmatch(rb"[0-9]+", process.pidfile) is None:
        return False
    params = process.cmdline.split(b"\n")[0].split(b"\0")
    if not params[0] or _QEMU_COMMAND.search(params[0]) is None:
        return False
    options: dict[bytes, bytes | None] = {}
    pending: bytes | None = None
    for param in params:
        if not param or param == b"0":
            continue  # Perl's `next if !$p`
        option = _OPTION.fullmatch(param)
        if option is not None:
            if pending is not None:
                options[pending] = None
            pending = option[1]
        elif pending is not None:
            options[pending], pending = param, None
    return options.get(b"pidfile") == f"{QEMU_RUN_DIR}/{vmid}.pid".encode()


def qemu_status_answer(raw: bytes, process: QemuProcess, vmid: int) -> dict[str, object] | None:
    """`GET .../qemu/{vmid}/status/current`'s `vmid`, `status` and `name` (qemu-server `vmstatus`: `running`
    when `check_running`, else `stopped`; the config's `name`, else `VM <vmid>`) for the config file `raw`
    and `process`; None where the config is not modelled (`qemu_config_answer`)."""
    config = qemu_config_answer(raw)
    if config is None:
        return None
    name = config.get("name") or f"VM {vmid}"
    return {"vmid": vmid, "status": "running" if qemu_running(process, vmid) else "stopped", "name": name}
