"""The lab's STAND-IN cloud images (NOT real disk images) and the HTTP server Proxmox lab nodes download them
from.

A lab image is a small file: a qcow2 version 3 header (magic `QFI\\xfb`, the image's virtual size at offset
24, the 104-byte header length; no L1 or refcount tables, so `qemu-img` would refuse it), then `MARKER` and
one line of JSON describing the system inside (`ImageMeta`). Whatever follows that line is ignored, so a
volume grown past the file's end (`resize`) still reads as the same image. Anything else, an empty disk
included, holds no system: `read_image` returns None.

The lab serves `CATALOGUE` (the real upstream file names) at `image_url(node, filename)`: every Proxmox lab
node's hypervisor companion (lab/pve/hypervisor.py) runs `serve` on the lab side of the node's veth,
10.200.<node index>.1:`PORT`, which only that node reaches. The bytes are built deterministically, so
`image_checksum` is stable across runs and machines.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import struct
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from lab import hosts

GIB = 1024**3
MAGIC = b"QFI\xfb"
HEADER_LENGTH = 104  # a qcow2 v3 header without extensions
MARKER = b"pvegpu-lab stand-in image\n"
PORT = 8098


@dataclass(frozen=True)
class ImageMeta:
    """The system a lab image holds: `os` (e.g. "debian-12"), whether its disk has an EFI system partition
    with a boot loader (`esp`: OVMF can boot it; SeaBIOS boots any installed system), whether cloud-init
    runs at first boot (`cloud_init`: a cloud image), whether qemu-guest-agent is installed already (`agent`:
    an installed system; cloud images get it from their user-data), and the disk's virtual size in bytes."""

    os: str
    esp: bool
    cloud_init: bool
    agent: bool = False
    virtual_size: int = 2 * GIB


# Upstream file name -> what the lab serves under it. Virtual sizes as upstream's images report them.
CATALOGUE: dict[str, ImageMeta] = {
    "debian-12-genericcloud-amd64.qcow2": ImageMeta("debian-12", esp=True, cloud_init=True),
    "debian-13-genericcloud-amd64.qcow2": ImageMeta(
        "debian-13", esp=True, cloud_init=True, virtual_size=3 * GIB
    ),
    # Proxmox's import content type does not take `.img`: download it under a `.qcow2` name (it is qcow2).
    "ubuntu-24.04-server-cloudimg-amd64.img": ImageMeta(
        "ubuntu-24.04", esp=True, cloud_init=True, virtual_size=3584 * 1024**2
    ),
}


def image_bytes(meta: ImageMeta) -> bytes:
    """The file of an image holding `meta` (the same bytes for the same meta)."""
    # magic, version, backing file offset/size, cluster_bits, size; ...; refcount_order, header_length.
    header = struct.pack(">4sIQIIQ", MAGIC, 3, 0, 0, 16, meta.virtual_size)
    header += bytes(96 - len(header)) + struct.pack(">II", 4, HEADER_LENGTH)
    fields = {key: value for key, value in asdict(meta).items() if key != "virtual_size"}
    return header + MARKER + json.dumps(fields, sort_keys=True).encode() + b"\n"


def write_image(path: Path, meta: ImageMeta) -> None:
    """Write an image holding `meta` at `path` (e.g. an installed VM's disk volume in a node's root)."""
    path.write_bytes(image_bytes(meta))


def read_image(data: bytes) -> ImageMeta | None:
    """The system in a disk's leading bytes, or None when they are not a lab image (an empty disk, a header
    from something else, a damaged description)."""
    if len(data) < HEADER_LENGTH or not data.startswith(MAGIC):
        return None
    rest = data[HEADER_LENGTH:]
    if not rest.startswith(MARKER):
        return None
    line = rest[len(MARKER) :].split(b"\n", 1)[0]
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    if not isinstance(fields, dict) or set(fields) != {"os", "esp", "cloud_init", "agent"}:
        return None
    flags = (fields["esp"], fields["cloud_init"], fields["agent"])
    if not isinstance(fields["os"], str) or not all(isinstance(flag, bool) for flag in flags):
        return None
    (virtual_size,) = struct.unpack_from(">Q", data, 24)
    return ImageMeta(fields["os"], *flags, virtual_size=virtual_size)


def read_image_file(path: Path) -> ImageMeta | None:
    """`read_image` of a disk's data file; None when the file is missing."""
    try:
        with path.open("rb") as disk:
            return read_image(disk.read(64 * 1024))
    except (FileNotFoundError, IsADirectoryError):
        return None


def esp_files(meta: ImageMeta) -> dict[str, bytes]:
    """The files on the EFI system partition of a system with one (paths under the guest's /boot/efi, as
    Debian's and Ubuntu's shim-signed and grub-efi-amd64 install them; STAND-IN bytes); {} without one."""
    if not meta.esp:
        return {}
    vendor = meta.os.split("-", 1)[0]
    stand_in = b"pvegpu lab stand-in EFI binary\n"
    return {f"EFI/{vendor}/{name}": stand_in for name in ("shimx64.efi", "grubx64.efi")} | {
        "EFI/BOOT/BOOTX64.EFI": stand_in
    }


def image_url(node: hosts.LabHost, filename: str) -> str:
    """Where Proxmox lab node `node` downloads catalogue image `filename`."""
    return f"http://10.200.{node.index}.1:{PORT}/{filename}"


def image_checksum(filename: str, algorithm: str = "sha512") -> str:
    """The hex digest (hashlib's `algorithm`, e.g. "sha256", "sha512") of catalogue image `filename`."""
    return hashlib.new(algorithm, image_bytes(CATALOGUE[filename])).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET/HEAD of a catalogue file; 404 for anything else."""

    server_version = "pvegpu-lab-images"

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        meta = CATALOGUE.get(self.path.lstrip("/"))
        if meta is None:
            self.send_error(404, "no such lab image")
            return
        data = image_bytes(meta)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        print(f"images: {self.address_string()} {format % args}", flush=True)


def serve(node: hosts.LabHost) -> http.server.ThreadingHTTPServer:
    """Serve the catalogue to `node` (at `image_url`) from a daemon thread."""
    return start_server((f"10.200.{node.index}.1", PORT))


def start_server(address: tuple[str, int]) -> http.server.ThreadingHTTPServer:
    """Serve the catalogue at `address` from a daemon thread; `shutdown()` the returned server to stop."""
    server = http.server.ThreadingHTTPServer(address, _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="lab-images", daemon=True).start()
    return server
