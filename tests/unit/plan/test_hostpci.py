"""hostpciN: the desired entries, the grammar of existing ones (qemu-server's pve-qm-hostpci, real configs
from Proxmox's own tests in real/20), and the change to make, leaving entries pvegpu does not own alone.
"""

from __future__ import annotations

import re

import pytest

from pvegpu.plan.hostpci import (
    HostPciChange,
    HostPciError,
    canonical_hostpci,
    desired_hostpci,
    diff_hostpci,
    parse_hostpci,
)
from tests.unit.realdata import real_fixture


def test_desired_one_pcie_mapping_per_gpu() -> None:
    assert desired_hostpci(["gpu0", "gpu1"]) == {
        "hostpci0": "mapping=gpu0,pcie=1",
        "hostpci1": "mapping=gpu1,pcie=1",
    }


def test_error_more_than_16() -> None:
    with pytest.raises(HostPciError, match=r"^17 GPUs, but a VM has at most 16 hostpci devices$"):
        desired_hostpci([f"gpu{n}" for n in range(17)])


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        # the oracle cases of the knowledge file
        ("0000:01:00,pcie=on,rombar=0", "0000:01:00,pcie=1,rombar=0"),
        ("host=01:00.0,driver=keep", "01:00.0,driver=keep"),
        ("01:00.0,romfile=vbios.rom,legacy-igd=1", "01:00.0,legacy-igd=1,romfile=vbios.rom"),
        ("pcie=yes,mapping=gpu0", "mapping=gpu0,pcie=1"),
    ],
)
def test_canonical_form(value: str, canonical: str) -> None:
    assert canonical_hostpci(parse_hostpci(value)) == canonical


def test_real_proxmox_test_configs_parse() -> None:
    """real/20: every hostpciN line of qemu-server's cfg2cmd hostpci tests parses. All but the two
    hand-written override lines are already in the canonical order."""
    text = real_fixture("20_proxmox_qemu_server_hostpci_vm_configs_and_kvm_cmdlines.txt").read_text()
    values = re.findall(r"^hostpci\d+: (.+)$", text, re.MULTILINE)
    assert len(values) == 17
    reordered = {
        v: canonical_hostpci(parse_hostpci(v)) for v in values if canonical_hostpci(parse_hostpci(v)) != v
    }
    assert reordered == {
        "00:ff.1,vendor-id=0x1234,device-id=0x5678,sub-vendor-id=0x2233,sub-device-id=0x0000": (
            "00:ff.1,device-id=0x5678,sub-device-id=0x0000,sub-vendor-id=0x2233,vendor-id=0x1234"
        ),
        "d0:13.0,pcie=1,vendor-id=0x1234,device-id=0x5678": (
            "d0:13.0,device-id=0x5678,pcie=1,vendor-id=0x1234"
        ),
    }
    assert parse_hostpci("mapping=someGpu,mdev=some-model") == {"mapping": "someGpu", "mdev": "some-model"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0000:C1:00.0", "host: value does not match the regex pattern"),
        ("01:00.0,device-id=2204", "device-id: value does not match the regex pattern"),
        ("01:00.0,multifunction=1", "invalid key in comma-separated list property: multifunction"),
        ("01:00.0,pcie=maybe", "pcie: type check ('boolean') failed - got 'maybe'"),
        ("01:00.0,mapping=gpu0", "Cannot set both 'host' and 'mapping'."),
        ("pcie=1", "Either 'host' or 'mapping' must be set."),
        ("mapping=gpu0,mapping=gpu1", "duplicate key in comma-separated list property: mapping"),
    ],
)
def test_error_value(value: str, message: str) -> None:
    with pytest.raises(HostPciError) as raised:
        parse_hostpci(value)
    assert str(raised.value) == message


DESIRED = desired_hostpci(["gpu0", "gpu1", "gpu2"])


def test_create_all_on_a_vm_without_hostpci() -> None:
    assert diff_hostpci(DESIRED, {"cores": 8}, "gpu") == HostPciChange(dict(DESIRED), ())


def test_noop_same_meaning_other_spelling() -> None:
    current = {
        "hostpci0": "mapping=gpu0,pcie=1",
        "hostpci1": "pcie=on,mapping=gpu1",
        "hostpci2": "mapping=gpu2,pcie=1",
    }
    change = diff_hostpci(DESIRED, current, "gpu")
    assert (change, change.changed) == (HostPciChange({}, ()), False)


def test_update_changed_and_delete_own_extra_but_keep_others() -> None:
    current = {
        "hostpci0": "mapping=gpu0",  # pcie missing
        "hostpci1": "mapping=gpu1,pcie=1",
        "hostpci2": "mapping=gpu2,pcie=1",
        "hostpci3": "mapping=gpu3,pcie=1",  # pvegpu's, no longer wanted
        "hostpci12": "mapping=gpu7,pcie=1",
        "hostpci5": "0000:43:00.0,pcie=1",  # someone's NIC
        "hostpci6": "mapping=nic0",  # someone's mapping
    }
    assert diff_hostpci(DESIRED, current, "gpu") == HostPciChange(
        {"hostpci0": "mapping=gpu0,pcie=1"}, ("hostpci3", "hostpci12")
    )


def test_error_slot_held_by_something_else() -> None:
    with pytest.raises(HostPciError) as raised:
        diff_hostpci(DESIRED, {"hostpci1": "0000:43:00.0,pcie=1"}, "gpu")
    assert (
        str(raised.value)
        == "hostpci1 holds '0000:43:00.0,pcie=1', which is not a gpu<N> mapping: free the slot first"
    )
