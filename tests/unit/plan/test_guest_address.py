"""A DHCP guest's address is the one its guest agent reports on net0's NIC, and only an IPv4 address pvegpu
would connect to (pvegpu.plan.guest_address; used by pvegpu.operations.guest_known).

Agent answers are in the shape of qemu-guest-agent's `guest-network-get-interfaces` as Proxmox passes it on
(`GET …/agent/network-get-interfaces`: `{"result": [{"name", "hardware-address", "ip-addresses"}]}`),
synthesized.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.models.pve import GuestInterface
from pvegpu.operations.guest_known import GuestIdentity, _learn_address
from pvegpu.operations.pve_guest import VM, Guest
from pvegpu.plan.guest_address import GuestAddressError, net0_address
from tests.unit.fake_pve import FakeApi

MAC = "bc:24:11:00:00:01"
LO = GuestInterface("lo", "00:00:00:00:00:00", ("127.0.0.1/8",))
DOCKER = GuestInterface("docker0", "02:42:ac:11:00:01", ("172.17.0.1/16",))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAjx3dFGVH5ncb4aJKg4ZGvqGEP7s8vQbK2S4/V9qL1m"
AGENT = "/nodes/pve1/qemu/100/agent/network-get-interfaces"


def test_the_address_is_net0s_whatever_the_other_interfaces_report() -> None:
    net0 = GuestInterface("ens18", MAC.upper(), ("10.0.0.5/24",))
    assert net0_address((LO, DOCKER, net0), MAC, 100) == "10.0.0.5"


@pytest.mark.parametrize(
    "interfaces",
    [(LO, DOCKER), (LO, GuestInterface("ens18", MAC, ()))],
)
def test_no_address_on_net0_yet_is_none(interfaces: tuple[GuestInterface, ...]) -> None:
    assert net0_address(interfaces, MAC, 100) is None


def test_a_link_local_address_before_the_leased_one_is_passed_over() -> None:
    net0 = GuestInterface("ens18", MAC, ("169.254.7.1/16", "10.0.0.5/24"))
    assert net0_address((net0,), MAC, 100) == "10.0.0.5"


@pytest.mark.parametrize(
    ("reported", "why"),
    [
        ("127.0.0.1", "a loopback address pvegpu will not connect to"),
        ("0.0.0.0", "an unspecified address pvegpu will not connect to"),
        ("224.0.0.251", "a multicast address pvegpu will not connect to"),
        ("169.254.7.1", "a link-local address pvegpu will not connect to"),
        ("240.0.0.1", "a reserved address pvegpu will not connect to"),
        ("10.0.0.5 ssh-ed25519 AAAA", "which is not an IPv4 address"),
        ("10.0.0.5\n*", "which is not an IPv4 address"),
    ],
)
def test_error_an_address_pvegpu_will_not_connect_to_is_refused(reported: str, why: str) -> None:
    net0 = GuestInterface("ens18", MAC, (f"{reported}/24",))
    with pytest.raises(GuestAddressError) as raised:
        net0_address((LO, net0), MAC, 100)
    assert str(raised.value) == f"VM 100's guest agent reports {reported!r} on net0 ({MAC}), {why}"


def _identity(tmp_path: Path) -> GuestIdentity:
    return GuestIdentity("gpu-vm", tmp_path / "known_hosts", tmp_path / "gpu-vm_ed25519", KEY, None)


def test_error_a_loopback_address_on_net0_fails_the_guest_before_anything_is_written(tmp_path: Path) -> None:
    api = FakeApi(
        {
            ("GET", "/nodes/pve1/qemu/100/config"):
                {"net0": f"virtio={MAC.upper()},bridge=vmbr0", "digest": "d"},
            ("GET", AGENT): {
                "result": [
                    {"name": "ens18", "hardware-address": MAC,
                     "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8}]},
                ]
            },
        }
    )  # fmt: skip

    with pytest.raises(OperationError) as raised:
        _learn_address(_identity(tmp_path), Guest(VM, api.client, "pve1", 100), None, 5)

    assert str(raised.value) == (
        f"guest gpu-vm: VM 100's guest agent reports '127.0.0.1' on net0 ({MAC}), a loopback address pvegpu "
        "will not connect to"
    )
    assert [path for _, path, _ in api.calls] == ["/nodes/pve1/qemu/100/config", AGENT]
    assert list(tmp_path.iterdir()) == []


def test_error_a_vm_without_a_net0_mac_is_refused(tmp_path: Path) -> None:
    api = FakeApi({("GET", "/nodes/pve1/qemu/100/config"): {"net0": "virtio,bridge=vmbr0", "digest": "d"}})

    with pytest.raises(OperationError) as raised:
        _learn_address(_identity(tmp_path), Guest(VM, api.client, "pve1", 100), None, 5)

    assert str(raised.value) == (
        "guest gpu-vm: VM 100 has no net0 MAC, the NIC whose address pvegpu takes from the guest agent"
    )
