"""VmSpec's cloud-image fields (`image`, `user`, `ssh_public_keys`, `ipconfig`, `snippets_storage`): what is
accepted, and the exact `host: path: message` lines of what is refused."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pvegpu.inventory.validate import validate_inventory
from pvegpu.models.errors import InventoryError
from pvegpu.models.vm import ImageUrl, ImageVolume, VmSpec

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5HcbcUQrpSUxW4nw/rMoAjNHG/aykHEZ6M+9fVDl2P you@desk"
KEY_BLOB = KEY.split()[1]
ECDSA = (
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBKd5gz8FroXvgKrKVLSdFKNAby0M1EiN"
    "XJsWFyD1t4x5yvgsnYtE7jF06hVpjoTliP6CURJ6Dd0esMbTHzPcIvQ="
)
SHA512 = "0123456789abcdef" * 8
URL = "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"
NODE = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}
KNOWN_HOSTS = {"ssh_known_hosts_file": "/home/op/pvegpu/known_hosts"}


def refused(vm: Mapping[str, object], host_data: Mapping[str, object] = KNOWN_HOSTS) -> list[str]:
    with pytest.raises(InventoryError) as raised:
        validate_inventory([("h", {"node": NODE, **host_data, "vm": {"vmid": 100, **vm}})])
    return list(raised.value.problems)


def test_defaults_without_an_image() -> None:
    spec = VmSpec(vmid=100)
    assert (spec.image, spec.user, spec.ssh_public_keys, spec.ipconfig, spec.snippets_storage) == (
        None,
        "root",
        (),
        "ip=dhcp",
        "local",
    )


def test_image_forms() -> None:
    by_volume = VmSpec.model_validate(
        {"vmid": 100, "image": {"volume": "local:import/debian-12.qcow2"}, "ssh_public_keys": [KEY]}
    )
    assert by_volume.image == ImageVolume(volume="local:import/debian-12.qcow2")
    by_url = VmSpec.model_validate(
        {"vmid": 100, "image": {"url": URL, "checksum": SHA512.upper()}, "ssh_public_keys": [KEY, ECDSA]}
    )
    assert by_url.image == ImageUrl(
        url=URL, checksum=SHA512, checksum_algorithm="sha512", storage="local", file_name=None
    )
    assert isinstance(by_url.image, ImageUrl)
    assert by_url.image.stored_name == "debian-12-genericcloud-amd64.qcow2"


def test_an_http_url_is_taken_with_its_checksum() -> None:
    image = ImageUrl(url="http://images.example/a.qcow2", checksum="ab" * 48, checksum_algorithm="sha384")
    assert (image.url, image.checksum_algorithm) == ("http://images.example/a.qcow2", "sha384")


def test_ubuntu_img_is_stored_under_its_file_name() -> None:
    image = ImageUrl(
        url="https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img",
        checksum="ab" * 32,
        checksum_algorithm="sha256",
        file_name="noble-server-cloudimg-amd64.qcow2",
    )
    assert image.stored_name == "noble-server-cloudimg-amd64.qcow2"


@pytest.mark.parametrize(
    ("vm", "problems"),
    [
        (
            {"image": {}},
            [
                "h: vm.image: must be a mapping with `volume` (an image on the node) or `url` and `checksum` "
                "(downloaded) (got {})"
            ],
        ),
        ({"image": {"url": URL}, "ssh_public_keys": [KEY]}, ["h: vm.image.checksum: is required"]),
        (
            {"image": {"url": "http://images.example/a.qcow2"}, "ssh_public_keys": [KEY]},
            ["h: vm.image.checksum: is required"],
        ),
        (
            {
                "image": {"url": URL, "checksum": "ab" * 16, "checksum_algorithm": "md5"},
                "ssh_public_keys": [KEY],
            },
            [
                "h: vm.image.checksum_algorithm: md5 is too weak to trust an image by: use sha256, sha384 or "
                "sha512"
            ],
        ),
        (
            {
                "image": {"url": URL, "checksum": "ab" * 28, "checksum_algorithm": "sha224"},
                "ssh_public_keys": [KEY],
            },
            [
                "h: vm.image.checksum_algorithm: sha224 is too weak to trust an image by: use sha256, "
                "sha384 or sha512"
            ],
        ),
        (
            {"image": {"volume": "local:import/a.qcow2", "checksum": SHA512}, "ssh_public_keys": [KEY]},
            ["h: vm.image.checksum: unknown field"],
        ),
        (
            {"image": {"url": URL, "checksum": SHA512, "chksum_algorithm": "md5"}, "ssh_public_keys": [KEY]},
            ["h: vm.image.chksum_algorithm: unknown field (did you mean 'checksum_algorithm'?)"],
        ),
        (
            {"image": {"volume": "local:iso/debian.iso"}, "ssh_public_keys": [KEY]},
            [
                "h: vm.image.volume: 'local:iso/debian.iso' is not a disk image volume like "
                "local:import/<file>.qcow2 (.qcow2, .raw or .vmdk)"
            ],
        ),
        (
            {
                "image": {"url": URL, "checksum": SHA512, "checksum_algorithm": "sha256"},
                "ssh_public_keys": [KEY],
            },
            ["h: vm.image: checksum has 128 hex digits; a sha256 digest has 64"],
        ),
        (
            {"image": {"url": "https://x.example/noble.img", "checksum": SHA512}, "ssh_public_keys": [KEY]},
            [
                "h: vm.image: the URL's file name 'noble.img' does not end in .qcow2, .raw or .vmdk "
                "(Proxmox's import content): set file_name (Ubuntu's .img cloud images are qcow2)"
            ],
        ),
        (
            {"image": {"url": "ftp://x.example/a.qcow2", "checksum": SHA512}, "ssh_public_keys": [KEY]},
            ["h: vm.image.url: 'ftp://x.example/a.qcow2' is not an http(s) URL of an image file"],
        ),
        ({"user": "Root"}, ["h: vm.user: 'Root' is not a login name (a-z, 0-9, _ and -, at most 32)"]),
        (
            {"snippets_storage": "Local"},
            ["h: vm.snippets_storage: 'Local' is not a Proxmox storage id (e.g. local)"],
        ),
    ],
)
def test_image_refusals(vm: dict[str, object], problems: list[str]) -> None:
    assert refused(vm) == problems


def test_image_needs_the_hosts_known_hosts_file() -> None:
    vm = {"image": {"volume": "local:import/a.qcow2"}, "ssh_public_keys": [KEY]}
    assert refused(vm, {}) == [
        "h: vm.image: needs the host's ssh_known_hosts_file: pvegpu records the guest's SSH host key there "
        "(strict first contact) and keeps the guest's key pair beside it, in guest-keys/"
    ]


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (
            f"ssh-rsa {KEY_BLOB} you@desk",
            "h: vm.ssh_public_keys.0: the key's data is a 'ssh-ed25519' key, not ssh-rsa",
        ),
        (f"ssh-ed25519 {KEY_BLOB[:20]}", "h: vm.ssh_public_keys.0: the ssh-ed25519 key's data is cut short"),
        (
            f"ssh-ed25519 {KEY_BLOB[:-1]}",
            "h: vm.ssh_public_keys.0: the ssh-ed25519 key's base64 does not decode (cut short or mistyped?)",
        ),
        (
            f"ssh-dss {KEY_BLOB}",
            "h: vm.ssh_public_keys.0: key type 'ssh-dss' is not one of ssh-ed25519, ssh-rsa, "
            "ecdsa-sha2-nistp256, ecdsa-sha2-nistp384, ecdsa-sha2-nistp521, sk-ssh-ed25519@openssh.com, "
            "sk-ecdsa-sha2-nistp256@openssh.com",
        ),
        (
            f'from="10.0.0.1" ssh-ed25519 {KEY_BLOB}',
            'h: vm.ssh_public_keys.0: \'from="10.0.0.1" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5H... is '
            "not an OpenSSH public key line (`<type> <base64> [comment]` on one line, e.g. "
            "`ssh-ed25519 AAAAC3Nz... you@desk`)",
        ),
        (
            f"{KEY}\nssh-ed25519 {KEY_BLOB} second",
            "h: vm.ssh_public_keys.0: 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN5HcbcUQrpSUxW4nw/r... is "
            "not an OpenSSH public key line (`<type> <base64> [comment]` on one line, e.g. "
            "`ssh-ed25519 AAAAC3Nz... you@desk`)",
        ),
    ],
)
def test_public_key_refusals(key: str, problem: str) -> None:
    assert refused({"ssh_public_keys": [KEY, key][1:]}) == [problem]


def test_a_key_listed_twice_is_refused() -> None:
    assert refused({"ssh_public_keys": [KEY, ECDSA, KEY]}) == ["h: vm.ssh_public_keys: lists a key twice"]


@pytest.mark.parametrize(
    "ipconfig",
    [
        "ip=dhcp",
        "ip=10.0.0.5/24,gw=10.0.0.1",
        "ip6=auto",
        "ip6=dhcp",
        "ip=dhcp,ip6=fd00::5/64,gw6=fd00::1",
        "ip=10.0.0.5/24,gw=10.0.0.1,ip6=fd00::5/64,gw6=fd00::1",
    ],
)
def test_ipconfig_accepted(ipconfig: str) -> None:
    assert VmSpec(vmid=100, ipconfig=ipconfig).ipconfig == ipconfig


@pytest.mark.parametrize(
    ("ipconfig", "message"),
    [
        ("", "'' is not one of ip=, gw=, ip6=, gw6= (Proxmox ipconfig0)"),
        (
            "ip=10.0.0.5/24,dns=1.1.1.1",
            "'dns=1.1.1.1' is not one of ip=, gw=, ip6=, gw6= (Proxmox ipconfig0)",
        ),
        ("ip=10.0.0.5", "ip=10.0.0.5 is not dhcp or an IPv4 address with its prefix (e.g. 10.0.0.5/24)"),
        (
            "ip=10.0.0.500/24",
            "ip=10.0.0.500/24 is not dhcp or an IPv4 address with its prefix (e.g. 10.0.0.5/24)",
        ),
        ("ip=auto", "ip=auto is not dhcp or an IPv4 address with its prefix (e.g. 10.0.0.5/24)"),
        (
            "ip6=fd00::5",
            "ip6=fd00::5 is not dhcp or auto or an IPv6 address with its prefix (e.g. fd00::5/64)",
        ),
        ("ip=10.0.0.5/24,ip=dhcp", "ip= is given twice"),
        ("gw=10.0.0.1", "gw= needs a static ip= address (none is given)"),
        ("ip=dhcp,gw=10.0.0.1", "gw= needs a static ip= address (got ip=dhcp)"),
        ("ip=10.0.0.5/24,gw=fd00::1", "gw=fd00::1 is not an IPv4 address"),
        ("ip6=auto,gw6=fd00::1", "gw6= needs a static ip6= address (got ip6=auto)"),
    ],
)
def test_ipconfig_refusals(ipconfig: str, message: str) -> None:
    assert refused({"ipconfig": ipconfig}) == [f"h: vm.ipconfig: {message}"]
