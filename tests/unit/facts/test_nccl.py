"""NCCL transport lines -> per-channel records, per-pair summaries and profile warnings.

Real logs from shared/fixtures/real (sources in each file's header, repeated in the tests): 13 (NCCL
issue #952: P2P/IPC/read + NET/Socket between nodes), 14 (issues #392, #417, #1817: `direct shared memory`,
`Ring` lines, busId ranks, P2P/direct pointer), 15 (nkotikal/NCCL-Tensor-Parallelism @ 0071dd79, NCCL
2.28.9: SHM/direct/direct next to P2P/CUMEM/read). Formats no capture shows (NCCL 2.30.7's `SHM/direct`,
`/CE`, `P2P/indirect`, GDRDMA) are synthesized from NCCL's format strings (knowledge file section 5).
"""

from __future__ import annotations

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.nccl import parse_transports, topology_file_lines
from pvegpu.models.nccl import ChannelTransport, PairTransport, Transport, summarize
from pvegpu.plan.nccl_transports import check_transports
from tests.unit.realdata import real_fixture

P2P_IN_VM = (
    "the vm profile expects SHM: P2P is not supported between passed-through GPUs and forcing it hangs or "
    "corrupts data"
)
SHM_ON_METAL = (
    "the baremetal profile expects P2P: P2P is off; check NCCL_P2P_LEVEL, `nvidia-smi topo -p2p r`, ACS and "
    "iommu=pt"
)


def log(number: int) -> list[str]:
    name = {
        13: "13_nccl_debug_info_p2p_ipc_read_channels.txt",
        14: "14_nccl_debug_info_shm_and_p2p_older_formats.txt",
        15: "15_nccl_debug_info_shm_direct_vs_p2p_cumem_4x_a100.txt",
    }[number]
    return real_fixture(name).read_text().splitlines()


def sections(lines: list[str]) -> list[list[str]]:
    """Fixture 14 joins three logs with `----` lines."""
    parts: list[list[str]] = [[]]
    for line in lines:
        if line == "----":
            parts.append([])
        else:
            parts[-1].append(line)
    return parts


def test_real_15_shm_direct_direct_and_p2p_cumem_read() -> None:
    records = parse_transports(log(15))
    assert len(records) == 16
    assert records[0] == ChannelTransport(
        line=5, channel=0, connection=0, src_rank=0, src_device="0", dst_rank=1, dst_device="1",
        direction=None, transport=Transport.P2P, detail="P2P/CUMEM/read",
    )  # fmt: skip
    assert records[1] == ChannelTransport(
        line=6, channel=0, connection=None, src_rank=1, src_device="1", dst_rank=2, dst_device="2",
        direction=None, transport=Transport.SHM, detail="SHM/direct/direct",
    )  # fmt: skip
    assert [pair.describe() for pair in summarize(records)] == [
        "ranks 0 -> 1: P2P/CUMEM/read (4 channels)",
        "ranks 1 -> 2: SHM/direct/direct (4 channels)",
        "ranks 2 -> 3: P2P/CUMEM/read (4 channels)",
        "ranks 3 -> 0: SHM/direct/direct (4 channels)",
    ]
    assert check_transports("baremetal", records) == (
        f"ranks 1 -> 2: SHM/direct/direct (4 channels); {SHM_ON_METAL}",
        f"ranks 3 -> 0: SHM/direct/direct (4 channels); {SHM_ON_METAL}",
    )
    assert check_transports("vm", records) == (
        f"ranks 0 -> 1: P2P/CUMEM/read (4 channels); {P2P_IN_VM}",
        f"ranks 2 -> 3: P2P/CUMEM/read (4 channels); {P2P_IN_VM}",
    )


def test_real_13_p2p_ipc_read_and_net_between_nodes() -> None:
    records = parse_transports(log(13))
    assert len(records) == 16
    net = [r for r in records if r.transport is Transport.NET]
    assert [(r.channel, r.connection, r.src_rank, r.dst_rank, r.direction, r.detail) for r in net] == [
        (3, 0, 15, 6, "send", "NET/Socket/3"),
        (7, 0, 15, 6, "send", "NET/Socket/3"),
    ]
    assert summarize(records)[0] == PairTransport(
        src_rank=8, dst_rank=15, transports=(Transport.P2P,), details=("P2P/IPC/read",), channels=7
    )
    # Two nodes: NET between them is expected; P2P inside each node is what bare metal wants.
    assert check_transports("lxc", records, single_node=False) == ()
    assert check_transports("lxc", records) == (
        "ranks 15 -> 6: NET/Socket/3 (2 channels); the lxc profile expects P2P: "
        "GPUs of one node talk over the network: P2P and SHM are both off",
    )


def test_real_14a_nccl_2_5_ring_lines_busid_ranks_direct_shared_memory() -> None:
    records = parse_transports(sections(log(14))[0])
    assert [(r.src_rank, r.src_device, r.dst_rank, r.dst_device, r.transport, r.detail) for r in records] == [
        (15, "41000", 0, "1b000", Transport.NET, "NET/IB/0"),
        (0, "1b000", 1, "1c000", Transport.P2P, "P2P/IPC"),
        (0, "1b000", 7, "41000", Transport.SHM, "direct shared memory"),
        (15, "41000", 0, "1b000", Transport.NET, "NET/IB/0"),
        (0, "1b000", 1, "1c000", Transport.P2P, "P2P/IPC"),
    ]
    assert records[0].direction == "receive"
    assert check_transports("baremetal", records, single_node=False) == (
        f"ranks 0 -> 7: direct shared memory (1 channel); {SHM_ON_METAL}",
    )


def test_real_14b_nccl_2_7_vm_p2p_ipc_busid_ranks() -> None:
    records = parse_transports(sections(log(14))[1])
    assert [(r.line, r.channel, r.connection, r.src_device, r.dst_device, r.detail) for r in records] == [
        (2, 0, None, "21000", "1000", "P2P/IPC")
    ]
    assert check_transports("vm", records) == (f"ranks 1 -> 0: P2P/IPC (1 channel); {P2P_IN_VM}",)


def test_real_14c_p2p_direct_pointer_among_other_lines() -> None:
    records = parse_transports(sections(log(14))[2])
    assert [(r.line, r.src_rank, r.dst_rank, r.detail) for r in records] == [
        (1, 7, 6, "P2P/direct pointer"),
        (4, 7, 6, "P2P/direct pointer"),
        (5, 1, 0, "P2P/direct pointer"),
    ]
    assert check_transports("baremetal", records) == ()


@pytest.mark.parametrize(
    ("detail", "transport"),
    [
        ("SHM/direct", Transport.SHM),  # NCCL 2.30.7+
        ("SHM/CE/direct", Transport.SHM),
        ("P2P/IPC/read/CE", Transport.P2P),
        ("P2P/CUMEM/CE", Transport.P2P),
        ("P2P/direct pointer/read", Transport.P2P),
        ("P2P/indirect/3[3]/read", Transport.P2P),
        ("NET/IB/0/GDRDMA", Transport.NET),
    ],
)
def test_synthesized_formats(detail: str, transport: Transport) -> None:
    line = f"node1:4242:4300 [0] NCCL INFO Channel 02 : 0[0] -> 1[1] via {detail}"
    (record,) = parse_transports([line])
    assert (record.channel, record.transport, record.detail) == (2, transport, detail)


def test_vm_with_shm_only_is_quiet() -> None:
    lines = [f"NCCL INFO Channel {channel:02d} : 0[0] -> 1[1] via SHM/direct" for channel in range(2)]
    assert check_transports("vm", parse_transports(lines)) == ()
    assert check_transports("vm", parse_transports(lines), p2p=False) == ()


def test_vm_with_p2p_proven_expects_p2p() -> None:
    """A VM whose P2P probe passed (or vm.p2p: on) has the P2P plan: P2P is what it expects, SHM a warning."""
    p2p = parse_transports(["NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"])
    shm = parse_transports(["NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct"])
    assert check_transports("vm", p2p, p2p=True) == ()
    assert check_transports("vm", shm, p2p=True) == (
        "ranks 1 -> 0: SHM/direct (1 channel); the vm profile with P2P proven expects P2P: the VM's P2P was "
        "proven but NCCL did not use it; check NCCL_P2P_DISABLE and the GPUDirect clique in the VM's args",
    )


def test_host_profile_without_p2p_expects_shm() -> None:
    """Every (profile, plan, transport) has its reason: a host-P2P profile whose plan keeps P2P off."""
    p2p = parse_transports(["NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"])
    net = parse_transports(["NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0"])
    assert check_transports("lxc", p2p, p2p=False) == (
        "ranks 0 -> 1: P2P/CUMEM/read (1 channel); the lxc profile without P2P expects SHM: the plan keeps "
        "P2P off but NCCL used it: is NCCL_P2P_DISABLE=1 set?",
    )
    assert check_transports("baremetal", net, p2p=False) == (
        "ranks 0 -> 1: NET/Socket/0 (1 channel); the baremetal profile without P2P expects SHM: GPUs of one "
        "node talk over the network: is NCCL_SHM_DISABLE set?",
    )


def test_noop_other_lines_and_empty_input() -> None:
    assert parse_transports([]) == ()
    assert (
        parse_transports(["NCCL INFO Connected all rings", "NCCL INFO Channel 00/02 :    0   1   2   3"])
        == ()
    )
    assert check_transports("vm", ()) == (
        "no NCCL channel lines found: set NCCL_DEBUG=INFO and restart the service to see transports",
    )


def test_error_unknown_transport_names_the_line() -> None:
    with pytest.raises(FactParseError) as caught:
        parse_transports(["x", "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/TELEPATHY"])
    assert str(caught.value) == "line 2: unknown NCCL transport 'P2P/TELEPATHY'"


def test_topology_file_lines_once_each_in_order() -> None:
    lines = [
        "llm:4711:4711 [0] NCCL INFO NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml",
        "llm:4712:4712 [1] NCCL INFO NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml",
        "llm:4711:4711 [0] NCCL INFO Could not open XML topology file /etc/pvegpu/nccl-topo.xml : "
        "No such file or directory",
        "llm:4711:4711 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
    ]
    assert topology_file_lines(lines) == (
        "NCCL_TOPO_FILE set by environment to /etc/pvegpu/nccl-topo.xml",
        "Could not open XML topology file /etc/pvegpu/nccl-topo.xml : No such file or directory",
    )
    assert topology_file_lines(lines[3:]) == ()
