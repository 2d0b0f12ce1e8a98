"""lab.pve.guest: the Q35 layout a Proxmox VM's guest sees for its hostpci devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import fakesys
from lab.pve.guest import GuestError, Passed, guest_topology, i440fx_guest, q35_guest
from lab.topologies import TOPOLOGIES

REFERENCE = TOPOLOGIES["reference"]


def _card(slot: str) -> tuple[str, ...]:
    return (f"{slot}.0", f"{slot}.1")


def test_each_card_sits_alone_behind_its_root_port_with_the_host_ids(tmp_path: Path) -> None:
    passed = [Passed(0, _card("0000:41:00")), Passed(4, _card("0000:c1:00")), Passed(1, _card("0000:51:00"))]

    manifest = fakesys.write_tree(tmp_path, q35_guest("g", REFERENCE, passed), "none")

    assert sorted(manifest["devices"]) == [
        "0000:00:00.0", "0000:00:01.0", "0000:00:10.0", "0000:00:1c.0", "0000:00:1c.1", "0000:00:1c.2",
        "0000:00:1c.3", "0000:00:1f.0", "0000:00:1f.2", "0000:00:1f.3",
        "0000:01:00.0", "0000:01:00.1", "0000:02:00.0", "0000:02:00.1", "0000:03:00.0", "0000:03:00.1",
    ]  # fmt: skip
    parents = {
        a: d["parents"] for a, d in manifest["devices"].items() if a.endswith(":00.0") and a[5:7] != "00"
    }
    assert parents == {
        "0000:01:00.0": ["0000:00:10.0"],  # hostpci4 (devfn 10.0 comes first on pcie.0)
        "0000:02:00.0": ["0000:00:1c.0"],  # hostpci0
        "0000:03:00.0": ["0000:00:1c.1"],  # hostpci1
    }
    gpu = manifest["devices"]["0000:02:00.0"]
    assert (gpu["vendor"], gpu["device"], gpu["subsystem_vendor"], gpu["subsystem_device"]) == (
        "10de",
        "2bb1",
        "10de",
        "204b",
    )
    assert (gpu["driver"], gpu["iommu_group"], gpu["numa_node"]) == (None, None, None)
    assert manifest["groups"] == {}
    port = tmp_path / "devices/pci0000:00/0000:00:10.0"
    assert (port / "max_link_speed").read_text() == "16.0 GT/s PCIe\n"
    assert (port / "max_link_width").read_text() == "32\n"
    resource = (tmp_path / "devices/pci0000:00/0000:00:1c.0/0000:02:00.0/resource").read_text()
    start, end, _ = resource.splitlines()[1].split()  # BAR1 keeps the host card's 128 GiB
    assert int(end, 16) - int(start, 16) + 1 == 128 << 30


@pytest.mark.parametrize(
    ("passed", "error"),
    [
        pytest.param(
            [Passed(0, _card("0000:41:00"), pcie=False)],
            "hostpci0: only pcie=1 passthrough is modelled by the lab",
            id="pcie0",
        ),
        pytest.param(
            [Passed(0, ("0000:42:00.0",))],
            "hostpci0: 0000:42:00.0 is not a function of reference",
            id="absent",
        ),
        pytest.param(
            [Passed(5, _card("0000:41:00"))],
            "root port 10.0 is missing (hostpci4 unset): QEMU's guest would not see the ports behind it",
            id="gap",
        ),
    ],
)
def test_refuses_what_the_lab_cannot_lay_out(passed: list[Passed], error: str) -> None:
    with pytest.raises(GuestError) as refused:
        q35_guest("g", REFERENCE, passed)
    assert str(refused.value) == error


def test_i440fx_guest_has_the_gpus_as_conventional_pci_at_qemu_servers_slots(tmp_path: Path) -> None:
    passed = [
        Passed(0, _card("0000:41:00"), pcie=False),
        Passed(1, _card("0000:51:00"), pcie=False),
        Passed(4, _card("0000:c1:00"), pcie=False),
    ]

    manifest = fakesys.write_tree(tmp_path, guest_topology("g", REFERENCE, "pc", passed), "none")

    assert sorted(manifest["devices"]) == [
        "0000:00:00.0", "0000:00:01.0", "0000:00:01.1", "0000:00:01.3", "0000:00:02.0",
        "0000:00:10.0", "0000:00:10.1", "0000:00:11.0", "0000:00:11.1", "0000:00:1f.0",
        "0000:01:0d.0", "0000:01:0d.1",
    ]  # fmt: skip
    ids = {a: (d["vendor"], d["device"]) for a, d in manifest["devices"].items() if a.startswith("0000:00:0")}
    assert ids == {
        "0000:00:00.0": ("8086", "1237"),
        "0000:00:01.0": ("8086", "7000"),
        "0000:00:01.1": ("8086", "7010"),
        "0000:00:01.3": ("8086", "7113"),
        "0000:00:02.0": ("1234", "1111"),
    }
    assert manifest["devices"]["0000:01:0d.0"]["parents"] == ["0000:00:1f.0"]  # hostpci4 behind pci.2
    assert (manifest["devices"]["0000:00:1f.0"]["vendor"], manifest["devices"]["0000:00:1f.0"]["device"]) == (
        "1b36",
        "0001",
    )
    gpu = manifest["devices"]["0000:00:10.0"]
    assert (gpu["vendor"], gpu["device"], gpu["driver"], gpu["iommu_group"]) == ("10de", "2bb1", None, None)
    assert not (tmp_path / "devices/pci0000:00/0000:00:10.0/max_link_speed").exists()  # conventional PCI
    assert guest_topology("g", REFERENCE, "q35", [Passed(0, _card("0000:41:00"))]).name == "q35-g"


def test_i440fx_refuses_pcie_passthrough() -> None:
    with pytest.raises(GuestError) as refused:
        i440fx_guest("g", REFERENCE, [Passed(0, _card("0000:41:00"))])
    assert str(refused.value) == "hostpci0: q35 machine model is not enabled"
