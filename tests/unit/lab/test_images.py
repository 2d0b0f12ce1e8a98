"""The lab's stand-in cloud images (lab/images.py): the file layout, what reads as a system, the stable
checksums the lab inventory pins, and the HTTP server the lab nodes download from."""

from __future__ import annotations

import hashlib
import json
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import images
from lab.hosts import LabHost
from lab.images import CATALOGUE, GIB, ImageMeta, image_bytes, read_image

DEBIAN_12 = CATALOGUE["debian-12-genericcloud-amd64.qcow2"]
PINNED_SHA256 = "e396259dcb63e4b8222e935709664a4bbca85e357b924565022a2124685d1a91"


def test_image_bytes_layout() -> None:
    data = image_bytes(ImageMeta("debian-12", esp=True, cloud_init=True, virtual_size=5 * GIB))
    assert data[:32] == struct.pack(">4sIQIIQ", b"QFI\xfb", 3, 0, 0, 16, 5 * GIB)
    assert data[32:96] == bytes(64)
    assert data[96:104] == struct.pack(">II", 4, 104)
    assert data[104:] == (
        b'pvegpu-lab stand-in image\n{"agent": false, "cloud_init": true, "esp": true, "os": "debian-12"}\n'
    )


@pytest.mark.parametrize("filename", sorted(CATALOGUE))
def test_read_image_round_trip(filename: str) -> None:
    assert read_image(image_bytes(CATALOGUE[filename])) == CATALOGUE[filename]


def test_read_image_of_a_grown_disk() -> None:
    installed = ImageMeta("debian-12", esp=False, cloud_init=False, agent=True)
    assert read_image(image_bytes(installed) + bytes(4096)) == installed


@pytest.mark.parametrize(
    "data",
    [
        b"",
        bytes(1024),  # a freshly allocated (empty) disk
        b"QFI\xfb" + bytes(200),  # a qcow2 header with nothing the lab put there
        image_bytes(DEBIAN_12)[:104] + b"pvegpu-lab stand-in image\n{not json\n",
        image_bytes(DEBIAN_12)[:104] + b'pvegpu-lab stand-in image\n{"os": "debian-12"}\n',
        image_bytes(DEBIAN_12)[:104]
        + b'pvegpu-lab stand-in image\n{"agent": 0, "cloud_init": true, "esp": true, "os": "debian-12"}\n',
        image_bytes(DEBIAN_12)[:104] + b'pvegpu-lab stand-in image\n["debian-12"]\n',
    ],
)
def test_read_image_none_for_anything_else(data: bytes) -> None:
    assert read_image(data) is None


def test_read_image_file(tmp_path: Path) -> None:
    path = tmp_path / "vm-100-disk-0.raw"
    images.write_image(path, DEBIAN_12)
    assert images.read_image_file(path) == DEBIAN_12
    assert images.read_image_file(path.with_name("missing.raw")) is None


def test_catalogue_names_and_sizes() -> None:
    assert {name: (meta.os, meta.virtual_size) for name, meta in CATALOGUE.items()} == {
        "debian-12-genericcloud-amd64.qcow2": ("debian-12", 2 * GIB),
        "debian-13-genericcloud-amd64.qcow2": ("debian-13", 3 * GIB),
        "ubuntu-24.04-server-cloudimg-amd64.img": ("ubuntu-24.04", 3584 * 1024**2),
    }
    assert all(meta.esp and meta.cloud_init and not meta.agent for meta in CATALOGUE.values())


def test_checksums_are_stable() -> None:
    name = "debian-12-genericcloud-amd64.qcow2"
    assert images.image_checksum(name, "sha256") == hashlib.sha256(image_bytes(DEBIAN_12)).hexdigest()
    # Pinned: the bytes must not change between runs or machines (an inventory may hold this checksum).
    assert images.image_checksum(name, "sha256") == PINNED_SHA256
    assert len(images.image_checksum(name)) == 128  # sha512 by default


def test_image_url() -> None:
    node = LabHost("pve1", "netns", "reference", 7, 1, 1, "ssh-ed25519 AAAA", "/sys", "/proc/cmdline")
    assert (
        images.image_url(node, "debian-12-genericcloud-amd64.qcow2")
        == "http://10.200.7.1:8098/debian-12-genericcloud-amd64.qcow2"
    )


@pytest.fixture
def server_url() -> Iterator[str]:
    server = images.start_server(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_server_serves_catalogue(server_url: str) -> None:
    name = "debian-13-genericcloud-amd64.qcow2"
    with urllib.request.urlopen(f"{server_url}/{name}", timeout=10) as answer:
        body = answer.read()
        assert answer.headers["Content-Length"] == str(len(body))
    assert body == image_bytes(CATALOGUE[name])
    head = urllib.request.Request(f"{server_url}/{name}", method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as answer:
        assert (answer.status, answer.read()) == (200, b"")


def test_server_404(server_url: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"{server_url}/debian-11-genericcloud-amd64.qcow2", timeout=10)
    assert raised.value.code == 404
    raised.value.close()


def test_meta_json_fields_are_the_dataclass_fields() -> None:
    fields = json.loads(image_bytes(DEBIAN_12)[104:].split(b"\n")[1])
    assert fields == {"os": "debian-12", "esp": True, "cloud_init": True, "agent": False}


def test_esp_files() -> None:
    stand_in = b"pvegpu lab stand-in EFI binary\n"
    assert images.esp_files(CATALOGUE["ubuntu-24.04-server-cloudimg-amd64.img"]) == {
        "EFI/ubuntu/shimx64.efi": stand_in,
        "EFI/ubuntu/grubx64.efi": stand_in,
        "EFI/BOOT/BOOTX64.EFI": stand_in,
    }
    assert images.esp_files(ImageMeta("debian-12", esp=False, cloud_init=False)) == {}
