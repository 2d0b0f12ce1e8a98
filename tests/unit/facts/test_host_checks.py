"""Doctor host checks: the HostChecks fact (parser + the command on a generated tree) and the check rows.

Config-space bytes are synthesized from the PCIe spec's layouts (extended capability header at 0x100, ACS
control at +6, Resizable BAR control at +8); the command runs for real on a lab.fakesys tree, whose config
files hold the 64 bytes an unprivileged read returns.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.facts import get_fact

from lab import fakesys
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.facts.host_checks import HostChecks, parse_host_checks
from pvegpu.models.hardware import HostHardware
from pvegpu.models.host_checks import HostCheckData, IdleState
from pvegpu.models.node import GpuSelector
from pvegpu.plan.host_checks import Check, extended_capabilities, host_checks
from pvegpu.plan.topology import plan_topology
from tests.unit.hostdata import two_cards
from tests.unit.pyinfra_local import local_state


def config_with(*caps: tuple[int, bytes]) -> bytes:
    """4096 bytes of config space with extended capabilities `(id, body)` chained from 0x100."""
    config = bytearray(4096)
    offset = 0x100
    for index, (cap_id, body) in enumerate(caps):
        following = offset + 0x40 if index + 1 < len(caps) else 0
        config[offset : offset + 4] = (cap_id | 1 << 16 | following << 20).to_bytes(4, "little")
        config[offset + 4 : offset + 4 + len(body)] = body
        offset = following
    return bytes(config)


ACS_ON = (0x0D, bytes([0x5F, 0x00, 0x1D, 0x00]))  # capability 0x005f, control 0x001d: SV RR CR UF
ACS_OFF = (0x0D, bytes([0x5F, 0x00, 0x00, 0x00]))
# Resizable BAR: entry 0 capability, then control: BAR index 1, 1 resizable BAR, size 17 -> 2^37 = 128 GiB.
REBAR_128G = (0x15, (0xFFFFF0).to_bytes(4, "little") + (1 | 1 << 5 | 17 << 8).to_bytes(4, "little"))
AER = (0x01, b"")


def test_extended_capabilities_walk_the_chain() -> None:
    assert extended_capabilities(config_with(AER, ACS_ON, REBAR_128G)) == {
        0x01: 0x100,
        0x0D: 0x140,
        0x15: 0x180,
    }
    assert extended_capabilities(bytes(64)) == {}


def test_parse_sections() -> None:
    lines = [
        "#pvegpu:interrupts",
        "12",
        "#pvegpu:cpuidle",
        "/sys/devices/system/cpu/cpu0/cpuidle/state0/name:POLL",
        "/sys/devices/system/cpu/cpu0/cpuidle/state1/name:C1",
        "/sys/devices/system/cpu/cpu0/cpuidle/state2/name:C2",
        "/sys/devices/system/cpu/cpu0/cpuidle/state2/disable:1",
        "#pvegpu:numa",
        "/sys/devices/system/node/node0/cpulist:0-63",
        "#pvegpu:config",
        "0000:41:00.0 de10b12b",
        "#pvegpu:iommu_types",
        "/sys/kernel/iommu_groups/27/type:DMA-FQ",
        "/sys/kernel/iommu_groups/31/type:identity",
        "#pvegpu:end",
    ]
    assert parse_host_checks(lines) == HostCheckData(
        remapped_interrupts=12,
        idle_states=(IdleState(0, "POLL", False), IdleState(1, "C1", False), IdleState(2, "C2", True)),
        numa_cpulists={0: "0-63"},
        config={"0000:41:00.0": bytes.fromhex("de10b12b")},
        group_types={27: "DMA-FQ", 31: "identity"},
    )


@pytest.mark.parametrize(
    ("config", "types", "message"),
    [
        (["0000:41:00.0 abc"], [], "line 6: expected '<address> <hex bytes>', got '0000:41:00.0 abc'"),
        ([], ["/sys/kernel/iommu_groups/x/type:DMA"],
         "line 7: expected .../kernel/iommu_groups/N/type:TYPE, got '/sys/kernel/iommu_groups/x/type:DMA'"),
    ],
)  # fmt: skip
def test_parse_refuses_a_garbled_line(config: list[str], types: list[str], message: str) -> None:
    lines = ["#pvegpu:interrupts", "0", "#pvegpu:cpuidle", "#pvegpu:numa", "#pvegpu:config", *config]
    with pytest.raises(FactParseError) as raised:
        parse_host_checks([*lines, "#pvegpu:iommu_types", *types, "#pvegpu:end"])
    assert str(raised.value) == message


def test_command_on_a_generated_tree(tmp_path: Path) -> None:
    fakesys.write_tree(tmp_path, "reference")
    state, local = local_state()
    data = get_fact(
        state,
        local,
        HostChecks,
        kwargs={
            "sysfs_root": str(tmp_path),
            "addresses": ("0000:40:01.1", "0000:41:00.0"),
            "groups": (0, 999),
        },
    )
    # The generated tree's groups are translated (its `type` files say DMA-FQ); group 999 does not exist.
    assert data.group_types == {0: "DMA-FQ"}
    assert sorted(data.config) == ["0000:40:01.1", "0000:41:00.0"]
    assert len(data.config["0000:41:00.0"]) == 64
    assert data.config["0000:41:00.0"][:4] == bytes.fromhex("de10b12b")  # 10de:2bb1, little-endian


def test_rows_on_the_reference_tree_with_root_readable_config(tmp_path: Path) -> None:
    fakesys.write_tree(tmp_path, "reference")
    hw = read_hardware_locally(tmp_path)
    topology = plan_topology(hw, GpuSelector(ids=("10de:2bb1",), count=8))
    data = HostCheckData(
        remapped_interrupts=7,
        idle_states=(IdleState(0, "POLL", False), IdleState(1, "C1", False), IdleState(2, "C2", False)),
        numa_cpulists={0: "0-63", 1: "64-127"},
        config={"0000:40:01.1": config_with(AER, ACS_ON), "0000:41:00.0": config_with(REBAR_128G)},
    )
    rows = host_checks(hw, topology, data)
    by_name = {row.check: row for row in rows}
    assert rows[:2] == (
        Check("IOMMU", "ok", f"on: {len({f.iommu_group for f in hw.functions} - {None})} IOMMU groups"),
        Check("interrupt remapping", "ok", "on: 7 IR- lines in /proc/interrupts"),
    )
    assert by_name["gpu0 ACS at 0000:40:01.1"] == Check(
        "gpu0 ACS at 0000:40:01.1",
        "warn",
        "ACS on (SrcValid ReqRedir CmpltRedir UpstreamFwd): P2P goes through the root complex",
    )
    assert by_name["gpu0 Resizable BAR"] == Check("gpu0 Resizable BAR", "ok", "current sizes: BAR1 128 GiB")
    assert by_name["gpu1 Resizable BAR"].state == "unknown"  # no config read for it
    assert by_name["CPU C-states"] == Check(
        "CPU C-states", "warn", "POLL, C1, C2: deep states enabled (latency spikes under load)"
    )
    assert by_name["NUMA nodes"] == Check("NUMA nodes", "ok", "node0: cpus 0-63, node1: cpus 64-127")
    assert [row.check for row in rows[-3:]] == ["DF C-states", "APBDIS", "SOC P-state"]
    assert {row.state for row in rows[-3:]} == {"bios"}


def test_acs_off_and_no_iommu() -> None:
    cards = two_cards()
    hw = HostHardware(tuple(cards.functions), iommu_present=False)
    off = HostCheckData(0, (), {}, {"0000:40:01.1": config_with(ACS_OFF)})
    rows = host_checks(hw, plan_topology(hw, GpuSelector(ids=("10de:2bb1",))), off)
    assert rows[0] == Check(
        "IOMMU", "problem", "off: no IOMMU groups (enable IOMMU / SVM / VT-d in the BIOS)"
    )
    assert rows[1] == Check("interrupt remapping", "warn", "off: no IR- interrupt chip in /proc/interrupts")
    assert Check("gpu0 ACS at 0000:40:01.1", "ok", "ACS off") in rows


@pytest.mark.parametrize(
    ("group_type", "port_acs", "expected"),
    [
        ("identity", ACS_ON,
         ("ok", "passthrough (identity): the IOMMU does not translate the GPU's DMA")),
        ("DMA-FQ", ACS_ON,
         ("warn", "translated (DMA-FQ) with ACS redirect at 0000:40:01.1: NCCL's P2P hangs in this "
          "combination; reboot into pvegpu's iommu=pt or turn ACS off in the BIOS, else set "
          "NCCL_P2P_DISABLE=1")),
        ("DMA", ACS_OFF,
         ("warn", "translated (DMA): P2P DMA goes through the IOMMU; reboot into pvegpu's iommu=pt")),
        ("blocked", ACS_OFF, ("unknown", "IOMMU group type 'blocked'")),
        (None, ACS_ON, ("unknown", "its IOMMU group's type was not readable")),
    ],
)  # fmt: skip
def test_dma_translation_rows_on_the_host_p2p_profiles(
    group_type: str | None, port_acs: tuple[int, bytes], expected: tuple[str, str]
) -> None:
    cards = two_cards()
    hw = HostHardware(tuple(cards.functions), iommu_present=True)
    topology = plan_topology(hw, GpuSelector(ids=("10de:2bb1",)))
    gpu0 = hw.by_address[topology.gpus[0].gpu_function]
    assert gpu0.iommu_group is not None
    assert gpu0.parents == ("0000:40:01.1",)
    types = {} if group_type is None else {gpu0.iommu_group: group_type}
    data = HostCheckData(0, (), {}, {"0000:40:01.1": config_with(AER, port_acs)}, types)
    for profile in ("lxc", "baremetal"):
        rows = {row.check: row for row in host_checks(hw, topology, data, profile)}
        assert rows["gpu0 DMA translation"] == Check("gpu0 DMA translation", *expected)
    # On `vm` the GPUs are vfio-pci's: no P2P on the host, no such row.
    assert "gpu0 DMA translation" not in {row.check for row in host_checks(hw, topology, data, "vm")}
