"""PCI hardware of a host, read from sysfs with ONE shell command, parsed by pure functions.

Stdlib only: the node's pre-start hook (pvegpu/hook) runs this module with the node's python3; the pyinfra
fact is facts/hardware.py.

`hardware_command(sysfs_root)` prints sections, each opened by a marker line `#pvegpu:<name>`, in this order:

    iommu       one line per entry of class/iommu/ (an IOMMU is active iff there is any)
    slots       `bus/pci/slots/<name>/address:<DDDD:BB[:DD]>` (grep -H)
    nodes       `devices/system/node/node<N>/cpulist:<list>` (grep -H), the host NUMA nodes' CPUs in the
                kernel's list format (`0-31,64-95`; empty for a memory-only node); none without CONFIG_NUMA
    devices     `<address> <link target>` for every bus/pci/devices/<address> symlink, e.g.
                `0000:41:00.0 ../../../devices/pci0000:40/0000:40:01.1/0000:41:00.0`
    links       `<address> driver|iommu_group <link target>`
    attributes  `<address>/<attribute>:<line>` (grep -H over every attribute file; `resource` gives 7+ lines)
    end

Paths are printed relative to sysfs_root (the command `cd`s there), so the root may be any directory with
a kernel-like tree, and a root path with spaces cannot break the parse. `parse_hardware` checks the shape
strictly: a garbled, truncated or foreign output raises `ParseError` naming the device and field.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pvegpu.facts.parsing import FactCommandError, ParseError, split_sections
from pvegpu.models.hardware import Bar, HostHardware, Link, NumaNode, PciFunction

_T = TypeVar("_T")

SECTIONS = ("iommu", "slots", "nodes", "devices", "links", "attributes", "end")

# Attribute files read per function. Ids/class are always there on a real kernel; numa_node needs
# CONFIG_NUMA; the link files exist only for PCIe functions (and may fail to read: grep -s skips them).
REQUIRED_ATTRIBUTES = ("vendor", "device", "subsystem_vendor", "subsystem_device", "class")
LINK_ATTRIBUTES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
ATTRIBUTES = (*REQUIRED_ATTRIBUTES, "numa_node", *LINK_ATTRIBUTES, "resource")

# `resource` lines 0-5 are the BARs, 6 the expansion ROM. Later lines are SR-IOV VF BARs (CONFIG_PCI_IOV)
# or bridge windows (bridges), depending on kernel config and device type, so they are not read.
BAR_LINES = 7
IORESOURCE_IO = 0x100
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x00100000

_SCRIPT = r"""
cd -- "$S" 2>/dev/null || { echo "pvegpu: sysfs root $S is not a readable directory" >&2; exit 1; }
echo '#pvegpu:iommu'
for f in class/iommu/*; do if [ -e "$f" ] || [ -h "$f" ]; then echo "${f#class/iommu/}"; fi; done
echo '#pvegpu:slots'
grep -sH '' bus/pci/slots/*/address
echo '#pvegpu:nodes'
grep -sH '' devices/system/node/node[0-9]*/cpulist
echo '#pvegpu:devices'
set --
if cd bus/pci/devices 2>/dev/null; then set -- *; if [ ! -e "$1" ] && [ ! -h "$1" ]; then set --; fi; fi
if [ $# -gt 0 ]; then find "$@" -maxdepth 0 -printf '%f %l\n'; fi
echo '#pvegpu:links'
if [ $# -gt 0 ]; then
  find -H "$@" -mindepth 1 -maxdepth 1 \( -name driver -o -name iommu_group \) -printf '%h %f %l\n'
fi
echo '#pvegpu:attributes'
if [ $# -gt 0 ]; then grep -sH '' @ATTRIBUTE_GLOBS@; fi
echo '#pvegpu:end'
"""

_ADDRESS = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ROOT_BUS = re.compile(r"pci([0-9a-f]{4,}:[0-9a-f]{2})")
_SLOT_LINE = re.compile(r"bus/pci/slots/([^/]+)/address:(.*)")
_SLOT_ADDRESS = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}(?::[0-9a-f]{2})?")
_NODE_LINE = re.compile(r"devices/system/node/node([0-9]{1,9})/cpulist:(.*)")
_CPU_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")
_ATTRIBUTE_LINE = re.compile(r"([^/]+)/([a-z_]+):(.*)")
_ID = re.compile(r"0x[0-9a-f]{4}")
_CLASS = re.compile(r"0x[0-9a-f]{6}")
_NUMA = re.compile(r"-?[0-9]+")
_SPEED = re.compile(r"([0-9]+(?:\.[0-9]+)?) GT/s(?: PCIe)?")
_UNKNOWN_SPEEDS = ("Unknown", "Unknown speed")
_DIGITS = re.compile(r"[0-9]+")
_RESOURCE = re.compile(r"0x([0-9a-f]{16}) 0x([0-9a-f]{16}) 0x([0-9a-f]{16})")


def hardware_command(sysfs_root: str = "/sys") -> str:
    """The one POSIX-sh command that reads every PCI function under `sysfs_root` (output: module docstring).

    Processes started: the shell, `find` twice and `grep` three times (one `grep` over all slot files, one
    over the NUMA nodes' cpulists, one over all attribute files of all functions), whatever the number of
    functions; with no PCI devices only the shell and the slot and node `grep`s. Needs GNU find
    (`-printf`) and grep. Exits 1 with a message on stderr if `sysfs_root` cannot be entered; a tree
    without PCI devices is a valid, empty answer.
    """
    globs = " ".join(f"*/{name}" for name in ATTRIBUTES)
    return f"S={shlex.quote(sysfs_root)}" + _SCRIPT.replace("@ATTRIBUTE_GLOBS@", globs)


def read_hardware_locally(sysfs_root: Path, timeout_s: float | None = None) -> HostHardware:
    """Run `hardware_command` on this machine with /bin/sh and parse it (offline CLI, tests, the node's hook).

    Raises FactCommandError (exit status and stderr) if the command fails or runs longer than `timeout_s`,
    ParseError if its output does not parse.
    """
    try:
        result = subprocess.run(
            ["/bin/sh", "-c", hardware_command(str(sysfs_root))],
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise FactCommandError(f"hardware command did not finish within {timeout_s:g} s") from None
    if result.returncode != 0:
        raise FactCommandError(f"hardware command failed (exit {result.returncode}): {result.stderr.strip()}")
    return parse_hardware(result.stdout.splitlines())


# Per-attribute parsers: the exact kernel formats (drivers/pci/pci-sysfs.c). Each raises ValueError with
# what it expected and what it got; parse_hardware adds the device address and attribute name.


def parse_id(text: str) -> str:
    """vendor, device, subsystem_vendor, subsystem_device: `0x%04x` -> "10de"."""
    if not _ID.fullmatch(text):
        raise ValueError(f"expected 0x%04x, got {text!r}")
    return text[2:]


def parse_class(text: str) -> int:
    """class: `0x%06x` -> 0x030000."""
    if not _CLASS.fullmatch(text):
        raise ValueError(f"expected 0x%06x, got {text!r}")
    return int(text, 16)


def parse_numa_node(text: str) -> int | None:
    """numa_node: `%d`; -1 (no NUMA information) -> None."""
    if not _NUMA.fullmatch(text) or int(text) < -1:
        raise ValueError(f"expected a node number or -1, got {text!r}")
    node = int(text)
    return None if node == -1 else node


def parse_cpulist(text: str) -> tuple[int, ...]:
    """A cpulist in the kernel's list format (`%*pbl`): "0-31,64-95" -> (0, ..., 31, 64, ..., 95); "" -> ().

    Ranges must ascend and not overlap, as the kernel prints them.
    """
    cpus: list[int] = []
    for part in text.split(",") if text else ():
        match = _CPU_RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"expected a list like 0-31,64-95, got {text!r}")
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        if last < first or (cpus and first <= cpus[-1]):
            raise ValueError(f"ranges must ascend without overlap, got {text!r}")
        cpus.extend(range(first, last + 1))
    return tuple(cpus)


def parse_link_speed(text: str) -> float | None:
    """current/max_link_speed: "32.0 GT/s PCIe" (old kernels "8 GT/s") -> 32.0; "Unknown[ speed]" -> None."""
    if text in _UNKNOWN_SPEEDS:
        return None
    match = _SPEED.fullmatch(text)
    if match is None:
        raise ValueError(f"expected '<float> GT/s[ PCIe]' or 'Unknown', got {text!r}")
    return float(match[1])


def parse_link_width(text: str) -> int:
    """current/max_link_width: `%u` lanes, no "x"."""
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"expected a lane count, got {text!r}")
    return int(text)


def parse_resource_line(index: int, text: str) -> Bar | None:
    """One `resource` line `0x%016llx 0x%016llx 0x%016llx` (start end flags); an unused region -> None."""
    match = _RESOURCE.fullmatch(text)
    if match is None:
        raise ValueError(f"line {index}: expected '0x%016llx 0x%016llx 0x%016llx', got {text!r}")
    start, end, flags = (int(group, 16) for group in match.groups())
    if start == 0 and end == 0:
        return None
    if end < start:
        raise ValueError(f"line {index}: end {end:#x} is below start {start:#x}")
    return Bar(
        index=index,
        start=start,
        size=end - start + 1,
        is_64bit=bool(flags & IORESOURCE_MEM_64),
        prefetchable=bool(flags & IORESOURCE_PREFETCH),
        is_io=bool(flags & IORESOURCE_IO),
    )


@dataclass
class _Record:
    """What the output says about one function, before it is checked and typed."""

    target: str
    attributes: dict[str, str] = field(default_factory=dict)
    resource: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)


def parse_hardware(lines: Sequence[str]) -> HostHardware:
    """Build HostHardware from `hardware_command` output. Pure; functions sorted by address.

    Raises ParseError naming the line, or the device address and field, for a missing or out-of-order
    section marker, an unknown line, a device without a kernel-like link (`.../pciDDDD:BB/.../<address>`),
    a missing required attribute (vendor, device, subsystem ids, class) or a value not in the kernel's format.
    """
    sections = split_sections(lines, SECTIONS)
    records: dict[str, _Record] = {}
    for number, line in sections["devices"]:
        address, _, target = line.partition(" ")
        if not _ADDRESS.fullmatch(address) or not target:
            raise ParseError(f"line {number}: expected '<address> <link target>', got {line!r}")
        if address in records:
            raise ParseError(f"line {number}: device {address} listed twice")
        records[address] = _Record(target=target)
    for number, line in sections["links"]:
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[1] not in ("driver", "iommu_group") or not parts[2]:
            expected = "'<address> driver|iommu_group <target>'"
            raise ParseError(f"line {number}: expected {expected}, got {line!r}")
        _record(records, parts[0], number).links[parts[1]] = parts[2]
    for number, line in sections["attributes"]:
        match = _ATTRIBUTE_LINE.fullmatch(line)
        if match is None or match[2] not in ATTRIBUTES:
            raise ParseError(f"line {number}: expected '<address>/<attribute>:<value>', got {line!r}")
        record = _record(records, match[1], number)
        if match[2] == "resource":
            record.resource.append(match[3])
        elif match[2] in record.attributes:
            raise ParseError(f"{match[1]}: {match[2]}: more than one line (line {number})")
        else:
            record.attributes[match[2]] = match[3]
    slots = _parse_slots(sections["slots"])
    functions = [_function(address, record, slots) for address, record in records.items()]
    functions.sort(key=lambda f: _address_key(f.address))
    return HostHardware(
        functions=tuple(functions),
        iommu_present=bool(sections["iommu"]),
        numa_nodes=_parse_nodes(sections["nodes"]),
    )


def _parse_nodes(entries: list[tuple[int, str]]) -> tuple[NumaNode, ...]:
    """The `nodes` section: one NumaNode per `devices/system/node/nodeN/cpulist:<list>` line, by number."""
    nodes: dict[int, NumaNode] = {}
    for number, line in entries:
        match = _NODE_LINE.fullmatch(line)
        if match is None:
            expected = "'devices/system/node/node<N>/cpulist:<list>'"
            raise ParseError(f"line {number}: expected {expected}, got {line!r}")
        node = int(match[1])
        if node in nodes:
            raise ParseError(f"line {number}: NUMA node {node} listed twice")
        try:
            nodes[node] = NumaNode(node, parse_cpulist(match[2]))
        except ValueError as error:
            raise ParseError(f"line {number}: node{node} cpulist: {error}") from None
    return tuple(nodes[node] for node in sorted(nodes))


def _record(records: dict[str, _Record], address: str, number: int) -> _Record:
    if address not in records:
        raise ParseError(f"line {number}: {address!r} is not in the device list")
    return records[address]


def _parse_slots(entries: list[tuple[int, str]]) -> dict[str, set[str]]:
    """Slot address (DDDD:BB:DD, or DDDD:BB when the kernel does not know the device number) -> names."""
    slots: dict[str, set[str]] = {}
    for number, line in entries:
        match = _SLOT_LINE.fullmatch(line)
        if match is None or not _SLOT_ADDRESS.fullmatch(match[2]):
            expected = "'bus/pci/slots/<name>/address:<DDDD:BB:DD>'"
            raise ParseError(f"line {number}: expected {expected}, got {line!r}")
        slots.setdefault(match[2], set()).add(match[1])
    return slots


def _physical_slot(address: str, slots: dict[str, set[str]]) -> str | None:
    """The one slot naming this function's device (or its bus); None if none, or if several claim it."""
    slot_address = address.rsplit(".", 1)[0]
    names = slots.get(slot_address, set()) | slots.get(slot_address.rsplit(":", 1)[0], set())
    return next(iter(names)) if len(names) == 1 else None


def _function(address: str, record: _Record, slots: dict[str, set[str]]) -> PciFunction:
    root_bus, parents = _bridge_chain(address, record.target)
    attrs = record.attributes

    def parsed(name: str, parse: Callable[[str], _T]) -> _T:
        if name not in attrs:
            raise ParseError(f"{address}: {name}: missing (no such attribute file, or it is empty)")
        try:
            return parse(attrs[name])
        except ValueError as error:
            # `from None`: pyinfra logs an exception's __cause__ in its place, which would drop the address.
            raise ParseError(f"{address}: {name}: {error}") from None

    def optional(name: str, parse: Callable[[str], _T]) -> _T | None:
        return parsed(name, parse) if name in attrs else None

    try:
        regions = (parse_resource_line(i, text) for i, text in enumerate(record.resource[:BAR_LINES]))
        bars = tuple(bar for bar in regions if bar is not None)
    except ValueError as error:
        raise ParseError(f"{address}: resource: {error}") from None
    link = Link(
        current_speed_gts=optional("current_link_speed", parse_link_speed),
        current_width=optional("current_link_width", parse_link_width),
        max_speed_gts=optional("max_link_speed", parse_link_speed),
        max_width=optional("max_link_width", parse_link_width),
    )
    group = record.links.get("iommu_group")
    driver = record.links.get("driver")
    return PciFunction(
        address=address,
        vendor=parsed("vendor", parse_id),
        device=parsed("device", parse_id),
        subsystem_vendor=parsed("subsystem_vendor", parse_id),
        subsystem_device=parsed("subsystem_device", parse_id),
        class_code=parsed("class", parse_class),
        driver=driver.rsplit("/", 1)[-1] if driver is not None else None,
        iommu_group=_group_number(address, group) if group is not None else None,
        numa_node=optional("numa_node", parse_numa_node),
        root_bus=root_bus,
        parents=parents,
        link=link if any(name in attrs for name in LINK_ATTRIBUTES) else None,
        bars=bars,
        physical_slot=_physical_slot(address, slots),
    )


def _group_number(address: str, target: str) -> int:
    name = target.rsplit("/", 1)[-1]
    if not _DIGITS.fullmatch(name):
        raise ParseError(f"{address}: iommu_group: link target {target!r} does not end in a group number")
    return int(name)


def _bridge_chain(address: str, target: str) -> tuple[str, tuple[str, ...]]:
    """Root bus and bridges from a device link target `../../../devices/pci0000:40/0000:40:01.1/<address>`.

    The root bus is the first `pciDDDD:BB` element (the host's root complex, also when a VMD domain nests
    another root bus below it); parents are the PCI addresses between it and the device.
    """
    elements = target.split("/")
    if elements[-1] != address:
        raise ParseError(f"{address}: device link: target {target!r} does not end in {address}")
    roots = [i for i, element in enumerate(elements) if _ROOT_BUS.fullmatch(element)]
    if not roots:
        raise ParseError(f"{address}: device link: target {target!r} has no pciDDDD:BB root bus element")
    chain = elements[roots[0] + 1 : -1]
    for element in chain:
        if not (_ADDRESS.fullmatch(element) or _ROOT_BUS.fullmatch(element)):
            raise ParseError(f"{address}: device link: unexpected element {element!r} in {target!r}")
    root_bus = elements[roots[0]][len("pci") :]
    return root_bus, tuple(element for element in chain if _ADDRESS.fullmatch(element))


def _address_key(address: str) -> tuple[int, int, int, int]:
    domain, bus, rest = address.split(":")
    device, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
