"""The guest's NCCL topology file: valid for NCCL's parser and readers, and each guest GPU under its card.

`parse` mirrors NCCL's src/graph/xml.cc file parser (NVIDIA/nccl master, 2026-06): its tokenizer (names end at
space, `>`, `/` or newline; values in double or single quotes; `/>` closes a leaf; `<!-- -->` skipped) and
its handlers (system > cpu > pci|nic, pci > pci|gpu|nic|pcilink, gpu > nvlink|c2c, nic > net; any other
element ignored). `READS` lists what topo.cc reads of each element once NCCL has filled what a file leaves
out; `fill` is that step (xml.cc ncclTopoGetXmlFromCpu / ncclTopoGetXmlFromGpu, topo.cc ncclTopoGetSystem).
The real dump is tests/unit/fixtures/nccl_topo_dump_vm_4x_a800.txt (shared/fixtures/real/12: NCCL's own
dump inside a VM with 4 A800s).

Guests are built the way the lab builds them: the node's sysfs from lab.topologies, the Q35 guest of a VM
passing every card (lab.pve.guest.q35_guest, gpuN as hostpciN), both read through the real hardware fact.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from lab.fakesys import write_tree
from lab.pve.guest import ROOT_PORTS, Passed, q35_guest
from lab.topologies import NVIDIA, TOPOLOGIES
from lab.topology import place
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.models.guest_state import MISSING, PathState
from pvegpu.models.hardware import HostHardware, Link
from pvegpu.operations.files import write_file
from pvegpu.operations.nccl_topo import nccl_topo_file
from pvegpu.plan.errors import PlanError
from pvegpu.plan.nccl_topo import LEFT_TO_NCCL, Q35_ROOT_PORTS, TOPO_FILE, plan_nccl_topo
from pvegpu.plan.topology import Topology, plan_vendor_topology
from tests.unit.host_states import decide_from, host_state
from tests.unit.op_harness import run_op

WITH_CARDS = sorted(
    name for name, t in TOPOLOGIES.items() if any(p.function.vendor == NVIDIA for p in place(t))
)
FIXTURE = Path(__file__).parents[1] / "fixtures" / "nccl_topo_dump_vm_4x_a800.txt"
HANDLERS = {
    None: ("system",),
    "system": ("cpu",),
    "cpu": ("pci", "nic"),
    "pci": ("pci", "gpu", "nic", "pcilink"),
    "gpu": ("nvlink", "c2c"),
    "nic": ("net",),
}
# What NCCL reads of each element (xml.cc ncclTopoXmlLoadSystem; topo.cc ncclTopoAddCpu, ncclTopoAddPci,
# ncclTopoAddGpu): the attribute and the values it accepts (None: any integer; a tuple: its kvDict keys,
# a value outside one falling back to a default instead of the real thing).
PCI_GEN = (
    "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s", "32 GT/s",
    "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe",
)  # fmt: skip
READS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "system": {"version": ("1",)},
    "cpu": {
        "numaid": None,
        "arch": ("x86_64", "arm64", "ppc64"),
        "vendor": ("GenuineIntel", "AuthenticAMD", "CentaurHauls", "  Shanghai  "),
        "familyid": None,
        "modelid": None,
        "affinity": (),
    },
    "pci": {
        "busid": (),
        "class": (),
        "vendor": (),
        "device": (),
        "subsystem_vendor": (),
        "subsystem_device": (),
        "link_speed": PCI_GEN,
        "link_width": None,
    },
    "gpu": {"dev": None, "sm": None, "rank": None, "gdr": None},
}
CPUID = {"arch": "x86_64", "vendor": "AuthenticAMD", "familyid": "175", "modelid": "17"}  # a Genoa's cpuid
# Read only when present (topo.cc `if (str != NULL)`): the CPU's affinity, the PCI ids (ncclTopoGetIntDevice).
OPTIONAL = {
    ("cpu", "affinity"),
    *(("pci", key) for key in ("vendor", "device", "subsystem_vendor", "subsystem_device")),
}
BUSID = re.compile(
    r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]"
)  # int64ToBusId's "%04lx:%02lx:%02lx.%01lx"


@dataclass
class Node:
    name: str
    attrs: dict[str, str]
    subs: list[Node] = field(default_factory=list)

    def walk(self) -> list[Node]:
        return [self, *(node for sub in self.subs for node in sub.walk())]


class NcclParseError(ValueError):
    pass


class _Reader:
    """xml.cc's xmlGetChar / xmlGetToken / xmlGetValue / xmlGetNode over a string."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def char(self) -> str:
        if self.at >= len(self.text):
            raise NcclParseError("XML Parse : Unexpected EOF")
        self.at += 1
        return self.text[self.at - 1]

    def token(self, value_allowed: bool) -> tuple[str, str | None, str]:
        name = ""
        while True:
            c = self.char()
            if c == "=":
                if not value_allowed:
                    raise NcclParseError(f"XML Parse : Unexpected value with name {name}")
                quote = self.char()
                if quote not in "\"'":
                    raise NcclParseError("XML Parse : Expected (double) quote.")
                value = ""
                while (c := self.char()) != quote:
                    value += c
                return name, value, self.char()
            if c in " >/\n\r":
                return name, None, c
            name += c

    def node(self) -> tuple[str, str, dict[str, str]] | None:
        """(type, name, attrs), type one of open/close/single; None at the end of the text."""
        c = " "
        while c in " \n\r":
            if self.at >= len(self.text):
                return None
            c = self.char()
        if c != "<":
            raise NcclParseError(f"XML Parse error : expecting '<', got '{c}'")
        name, _, c = self.token(False)
        if name.startswith("!--"):
            end = self.text.find("-->", self.at - 1)
            if end < 0:
                raise NcclParseError("XML Parse error : unterminated comment")
            self.at = end + 3
            return self.node()
        if name == "" and c == "/":
            name, _, c = self.token(False)
            if c != ">":
                raise NcclParseError(f"XML Parse error : unexpected trailing {c} in closing tag {name}")
            return "close", name, {}
        attrs: dict[str, str] = {}
        while c == " ":
            key, value, c = self.token(True)
            if value is None:  # a second space: NCCL stores an empty attribute, we need not
                continue
            attrs[key] = value
        kind = "open"
        if c == "/":
            kind = "single"
            _, _, c = self.token(False)
        if c != ">":
            raise NcclParseError(f"XML Parse : expected >, got '{c}'")
        return kind, name, attrs


def parse(text: str) -> Node:
    """The `<system>` tree NCCL loads from `text` (xml.cc xmlLoadSub with the handlers of HANDLERS)."""
    reader = _Reader(text)
    root = Node("", {})

    def load(head: Node | None, kind: str) -> None:
        if kind == "single":
            return
        while True:
            got = reader.node()
            if got is None:
                if head is not None:
                    raise NcclParseError(f"XML Parse : unterminated {head.name}")
                return
            sub_kind, name, attrs = got
            if head is not None and sub_kind == "close":
                if name != head.name:
                    raise NcclParseError(f"XML Mismatch : {head.name} / {name}")
                return
            handled = name in HANDLERS[head.name if head is not None else None]
            node = Node(name, attrs)
            if handled:
                (head or root).subs.append(node)
                if name == "system" and attrs.get("version") != "1":
                    raise NcclParseError(f"XML Topology has wrong version {attrs.get('version')}, 1 needed")
            load(node, sub_kind)

    load(None, "open")
    [system] = root.subs
    return system


def fill(system: Node) -> Node:
    """What NCCL adds to a loaded file for each of its GPUs before reading it: the cpu attributes a file
    leaves out (cpuid, the node's cpumap) and each GPU's `<gpu>` (NVML, the communicator)."""
    for cpu in system.subs:
        for key in ("arch", "vendor", "familyid", "modelid", "affinity"):
            cpu.attrs.setdefault(key, CPUID.get(key, ""))
        for rank, pci in enumerate(n for n in cpu.walk() if n.name == "pci"):
            if pci.attrs["class"].startswith("0x03") and not any(sub.name == "gpu" for sub in pci.subs):
                pci.subs.append(Node("gpu", {"dev": str(rank), "sm": "120", "rank": str(rank), "gdr": "0"}))
    return system


def unread(system: Node) -> list[str]:
    """Each attribute of READS missing or outside the values NCCL knows, as `element attr=value`."""
    problems = []
    for node in system.walk():
        for key, known in READS.get(node.name, {}).items():
            value = node.attrs.get(key)
            if value is None and (node.name, key) not in OPTIONAL:
                problems.append(f"{node.name} {key} missing")
            elif value is None:
                continue
            elif known is None and not re.fullmatch(r"-?[0-9]+", value):
                problems.append(f"{node.name} {key}={value!r} not an integer")
            elif known and value not in known:
                problems.append(f"{node.name} {key}={value!r} not one NCCL knows")
        if node.name == "pci" and not BUSID.fullmatch(node.attrs.get("busid", "")):
            problems.append(f"pci busid={node.attrs.get('busid')!r} not as NCCL writes its GPUs' bus ids")
    return problems


def pairs(system: Node) -> set[tuple[str, str]]:
    return {(node.name, key) for node in system.walk() for key in node.attrs}


def dump() -> str:
    return FIXTURE.read_text().split("\n", 1)[1]  # line 1: the SOURCE note


@dataclass(frozen=True)
class Box:
    """A lab node and the Q35 guest of a VM passing every card (gpuN as hostpciN), both read back."""

    hardware: HostHardware
    topology: Topology
    guest: HostHardware
    expected: dict[str, int]  # guest GPU bus id -> hostpci index, from the lab's own guest model


def box(root: Path, name: str, order: tuple[int, ...] | None = None) -> Box:
    """`order`: the card each hostpci index passes (default: gpuN as hostpciN)."""
    write_tree(root / "host", name, "vfio-pci")
    hardware = read_hardware_locally(root / "host")
    topology = plan_vendor_topology(hardware, "10de")
    cards = [topology.gpus[n] for n in (order or range(len(topology.gpus)))]
    passed = [Passed(n, card.functions) for n, card in enumerate(cards)]
    manifest = write_tree(root / "guest", q35_guest("g", TOPOLOGIES[name], passed), "none")
    port_of = {f"0000:00:{dev:02x}.{fn}": n for n, (dev, fn) in ROOT_PORTS.items()}
    expected = {
        address: port_of[device["parents"][0]]
        for address, device in manifest["devices"].items()
        if device["vendor"] == "10de" and device["class"].startswith("0x03")
    }
    return Box(hardware, topology, read_hardware_locally(root / "guest"), expected)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Box:
    return box(tmp_path_factory.mktemp("reference"), "reference")


GPU_LINE = (
    '    <pci busid="0000:0{}:00.0" class="0x030000" vendor="0x10de" device="0x2bb1" '
    'subsystem_vendor="0x10de" subsystem_device="0x204b" link_speed="32.0 GT/s PCIe" link_width="16"/>'
)
REFERENCE_XML = "\n".join(
    [
        '<system version="1">',
        '  <cpu numaid="0" arch="x86_64" vendor="AuthenticAMD">',
        *(GPU_LINE.format(bus) for bus in (5, 6, 7, 8)),  # hostpci0-3: root ports 1c.0-1c.3
        "  </cpu>",
        '  <cpu numaid="1" arch="x86_64" vendor="AuthenticAMD">',
        *(GPU_LINE.format(bus) for bus in (1, 2, 3, 4)),  # hostpci4-7: root ports 10.0-10.3, enumerated first
        "  </cpu>",
        "</system>",
        "",
    ]
)


def test_the_real_dump_parses_and_shows_what_a_guest_lacks() -> None:
    system = parse(dump())

    assert [cpu.attrs for cpu in system.subs] == [
        {"numaid": "-1", "arch": "x86_64", "vendor": "GenuineIntel", "familyid": "6", "modelid": "134"}
    ]
    gpus = [node for node in system.walk() if node.name == "pci"]
    assert [(g.attrs["busid"], g.attrs["link_speed"], g.attrs["link_width"]) for g in gpus] == [
        ("0000:00:09.0", "", "0"),
        ("0000:00:0a.0", "", "0"),
        ("0000:00:0b.0", "", "0"),
        ("0000:00:0c.0", "", "0"),
    ]
    assert unread(system) == ["pci link_speed='' not one NCCL knows" for _ in gpus]


def test_reference_box_file_exactly(reference: Box) -> None:
    topo = plan_nccl_topo(reference.topology, reference.hardware, reference.guest, "amd")

    assert topo.xml == REFERENCE_XML
    assert [(g.guest_address, g.hostpci, g.card.name, g.card.address, g.numaid) for g in topo.gpus] == [
        ("0000:01:00.0", 4, "gpu4", "0000:c1:00", 1),
        ("0000:02:00.0", 5, "gpu5", "0000:d1:00", 1),
        ("0000:03:00.0", 6, "gpu6", "0000:e1:00", 1),
        ("0000:04:00.0", 7, "gpu7", "0000:f1:00", 1),
        ("0000:05:00.0", 0, "gpu0", "0000:41:00", 0),
        ("0000:06:00.0", 1, "gpu1", "0000:51:00", 0),
        ("0000:07:00.0", 2, "gpu2", "0000:61:00", 0),
        ("0000:08:00.0", 3, "gpu3", "0000:71:00", 0),
    ]


def test_file_has_every_attribute_nccl_reads_once_nccl_fills_its_own(reference: Box) -> None:
    ours = parse(plan_nccl_topo(reference.topology, reference.hardware, reference.guest, "amd").xml)
    real = parse(dump())

    # What the real dump has and the file has not: exactly what NCCL fills itself, and NICs it adds itself.
    nics = {(node.name, key) for node in real.walk() if node.name in ("nic", "net") for key in node.attrs}
    assert pairs(real) - pairs(ours) == (set(LEFT_TO_NCCL) & pairs(real)) | nics
    # The dump has no affinity: its numaid -1 has no cpumap.
    assert set(LEFT_TO_NCCL) - pairs(real) == {("cpu", "affinity")}
    assert pairs(ours) - pairs(real) == set()
    assert unread(fill(ours)) == []


def test_without_a_cpu_vendor_arch_and_vendor_are_left_to_nccl(reference: Box) -> None:
    xml = plan_nccl_topo(reference.topology, reference.hardware, reference.guest, None).xml

    assert [cpu.attrs for cpu in parse(xml).subs] == [{"numaid": "0"}, {"numaid": "1"}]
    assert unread(fill(parse(xml))) == []


def test_every_lab_topology_with_nvidia_cards_is_checked() -> None:
    assert sorted(set(TOPOLOGIES) - set(WITH_CARDS)) == ["qemu-probe"]


@pytest.mark.parametrize("name", WITH_CARDS)
def test_every_guest_gpu_is_mapped_to_its_card_on_every_lab_topology(tmp_path: Path, name: str) -> None:
    lab = box(tmp_path, name)
    topo = plan_nccl_topo(lab.topology, lab.hardware, lab.guest, "amd")

    assert {gpu.guest_address: gpu.hostpci for gpu in topo.gpus} == lab.expected
    assert len(topo.gpus) == len(lab.topology.gpus) == len(lab.expected)
    nodes = sorted({card.numa_node for card in lab.topology.gpus if card.numa_node is not None})
    for gpu in topo.gpus:
        card = lab.topology.gpus[gpu.hostpci]
        assert gpu.card == card
        assert gpu.numaid == (-1 if card.numa_node is None else nodes.index(card.numa_node))
    system = parse(topo.xml)
    under = {pci.attrs["busid"]: int(cpu.attrs["numaid"]) for cpu in system.subs for pci in cpu.subs}
    assert under == {gpu.guest_address: gpu.numaid for gpu in topo.gpus}
    assert unread(fill(system)) == []


def test_the_root_port_table_is_qemu_servers() -> None:
    lab_ports = {f"0000:00:{dev:02x}.{fn}": n for n, (dev, fn) in ROOT_PORTS.items()}
    assert lab_ports == Q35_ROOT_PORTS


def test_link_is_the_card_limited_by_its_upstream_port(tmp_path: Path) -> None:
    lab = box(tmp_path, "reference")
    card = lab.topology.gpus[2]
    port = lab.hardware.by_address[lab.hardware.by_address[card.gpu_function].parents[-1]]
    assert port.link is not None
    slow_port = replace(port, link=replace(port.link, max_speed_gts=16.0, max_width=8))
    idle_card = replace(card, link=Link(2.5, 16, None, None))  # trained down, max unknown: current counts
    hardware = HostHardware(
        tuple(slow_port if f.address == port.address else f for f in lab.hardware.functions), True
    )
    topology = replace(lab.topology, gpus=tuple(idle_card if g is card else g for g in lab.topology.gpus))

    [gpu] = [g for g in plan_nccl_topo(topology, hardware, lab.guest, "amd").gpus if g.hostpci == 2]

    assert (gpu.link_speed, gpu.link_width) == ("2.5 GT/s PCIe", 8)


def test_error_a_card_the_guest_does_not_show(tmp_path: Path) -> None:
    lab = box(tmp_path, "reference", order=(0, 1, 2, 3, 4, 5, 6))

    with pytest.raises(PlanError) as error:
        plan_nccl_topo(lab.topology, lab.hardware, lab.guest, "amd")

    assert str(error.value) == (
        "vm: the guest shows no GPU for hostpci7 (gpu7, 0000:f1:00): is the VM running its config?"
    )


def test_error_a_guest_gpu_that_is_not_its_cards_model(tmp_path: Path) -> None:
    lab = box(tmp_path, "reference-other-card", order=(0, 1, 2, 3, 5, 4, 6, 7))  # hostpci4 passes gpu5

    with pytest.raises(PlanError) as error:
        plan_nccl_topo(lab.topology, lab.hardware, lab.guest, "amd")

    assert str(error.value) == (
        "vm: guest GPU 0000:01:00.0 (hostpci4) is 10de:26b1 (subsystem 10de:16a1), "
        "but gpu4 (0000:c1:00) is 10de:2bb1 (subsystem 10de:204b)"
    )


def test_error_a_guest_gpu_not_behind_a_hostpci_root_port(reference: Box) -> None:
    moved = tuple(
        replace(f, parents=("0000:00:02.0",)) if f.address == "0000:03:00.0" else f
        for f in reference.guest.functions
    )

    with pytest.raises(PlanError) as error:
        plan_nccl_topo(reference.topology, reference.hardware, HostHardware(moved, False), "amd")

    assert str(error.value) == (
        "vm: guest GPU 0000:03:00.0 sits behind 0000:00:02.0, "
        "not a q35 root port of a hostpci device (pcie=1)"
    )


def test_the_file_is_written_only_when_it_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    content = REFERENCE_XML
    same = PathState("file", "644", "root", "root", hashlib.sha256(content.encode()).hexdigest())

    decide_from(monkeypatch, host_state(paths={TOPO_FILE: same}))
    assert run_op(nccl_topo_file, {}, content=content) == (
        [],
        ["/etc/pvegpu/nccl-topo.xml already describes the host's GPU layout"],
    )
    decide_from(monkeypatch, host_state(paths={TOPO_FILE: MISSING}))
    commands, noops = run_op(nccl_topo_file, {}, content=content)
    assert (commands, noops) == ([write_file(TOPO_FILE, content).get_raw_value()], [])
