"""The pvesh stand-in's endpoints for a VM made from a cloud image (issue 11): storage.cfg and storage
content, download-url, import-from and resize, cloud-init keys and what a start hands the lab hypervisor,
guest agent.

Run as a program against a temporary root, as tests/unit/lab/pve/test_pvesh.py does. Expected texts were
read in
Proxmox's source: pve-storage (API2/Storage/{Config,Content,Status}.pm, Storage.pm, Storage/Plugin.pm),
pve-common (Tools.pm download_file_from_url, JSONSchema.pm), qemu-server (API2/Qemu.pm, QemuServer/Drive.pm,
QemuServer/Cloudinit.pm, QemuServer/Agent.pm).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import re
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PVESH = Path(__file__).resolve().parents[4] / "lab/pve/pvesh.py"
UPID = re.compile(r'"(UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:([\w-]+):([^:]*):root@pam:)"\n')
DEFAULT_CFG = (
    "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\n"
    "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir,images\n\n"
)
GIB = 1024**3
# An ed25519 public key (a valid blob: length-prefixed type name, then the 32-byte key).
KEY_BLOB = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(range(32))).decode()
KEY = f"ssh-ed25519 {KEY_BLOB} op@laptop"


@dataclass
class Result:
    rc: int
    out: str
    err: str


@dataclass
class Hypervisor:
    """A stand-in for lab/pve/hypervisor.py: records each request and answers with `reply(request)`."""

    folder: Path
    reply: Callable[[dict[str, Any]], dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def serve(self) -> None:
        while not self.stop.wait(0.02):
            for request_path in sorted(self.folder.glob("*.request")):
                request = json.loads(request_path.read_text())
                request_path.unlink()
                self.requests.append(request)
                answer = request_path.with_suffix(".answer")
                partial = answer.with_suffix(".partial")
                partial.write_text(json.dumps(self.reply(request)))
                partial.rename(answer)


@dataclass
class Pve:
    base: Path
    hypervisor: Hypervisor

    @property
    def root(self) -> Path:
        return self.base / "root"

    def __call__(self, *args: str) -> Result:
        env = {"PVEGPU_LAB_PVE_CONFIG": str(self.base / "pve.json"), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, str(PVESH), *args], check=False, capture_output=True, text=True, env=env
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def json(self, *args: str) -> Any:
        result = self(*args, "--output-format", "json")
        assert (result.rc, result.err) == (0, ""), result
        return json.loads(result.out)

    def task(self, result: Result, task_type: str, task_id: str = "100") -> dict[str, Any]:
        """The status of the task `result` printed (its UPID, last line)."""
        match = UPID.fullmatch(result.out.splitlines(keepends=True)[-1])
        assert match is not None, result
        assert (result.rc, match.group(2), match.group(3)) == (0, task_type, task_id)
        status: dict[str, Any] = self.json("get", f"/nodes/pve1/tasks/{match.group(1)}/status")
        return status

    def write(self, rel: str, data: bytes | str) -> Path:
        path = self.root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path

    def file(self, rel: str) -> str:
        return (self.root / rel.lstrip("/")).read_text()


def _started(request: dict[str, Any]) -> dict[str, Any]:
    if request["action"] == "agent":
        if request["command"] == "exec" and request["params"]["command"] == ["false"]:
            return {"ok": False, "error": "Failed to execute child process \u201cfalse\u201d"}
        return {"ok": True, "result": {"echo": request["command"]}}
    return {"ok": True, "pid": 4242, "guest": None}


@pytest.fixture
def pve(tmp_path: Path) -> Iterator[Pve]:
    hv = Hypervisor(tmp_path / "hv", _started)
    hv.folder.mkdir()
    settings: dict[str, Any] = {"node": "pve1", "sysfs_root": str(tmp_path / "sys")}
    settings.update(root=str(tmp_path / "root"), hypervisor_dir=str(hv.folder), hypervisor_timeout_s=20)
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    thread = threading.Thread(target=hv.serve, daemon=True)
    thread.start()
    yield Pve(tmp_path, hv)
    hv.stop.set()
    thread.join()


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def qcow2(virtual_size: int, payload: bytes = b"debian-12") -> bytes:
    """A qcow2 header (magic, version 3, no backing file, 64 KiB clusters, the virtual size) and a payload."""
    header = b"QFI\xfb" + (3).to_bytes(4, "big") + bytes(12) + (16).to_bytes(4, "big")
    return header + virtual_size.to_bytes(8, "big") + payload


def usage(cmd: str, required: str = "") -> str:
    return f"pvesh {cmd} <api_path> {required}[OPTIONS] [FORMAT_OPTIONS]\n"


def enable(pve: Pve, content: str) -> None:
    assert pve("set", "/storage/local", "--content", content).rc == 0


# --- storage.cfg ----------------------------------------------------------------------------------------


def test_storage_index_reads_the_installers_storage_cfg_when_there_is_none(pve: Pve) -> None:
    digest = sha1(DEFAULT_CFG)
    assert pve.json("get", "/storage") == [
        {
            "content": "iso,vztmpl,backup",
            "digest": digest,
            "path": "/var/lib/vz",
            "storage": "local",
            "type": "dir",
        },
        {
            "content": "rootdir,images",
            "digest": digest,
            "storage": "local-lvm",
            "thinpool": "data",
            "type": "lvmthin",
            "vgname": "pve",
        },
    ]
    assert [s["storage"] for s in pve.json("get", "/storage", "--type", "lvmthin")] == ["local-lvm"]
    assert pve.json("get", "/storage/local")["digest"] == digest
    assert pve("get", "/storage/nfs1") == Result(255, "", "storage 'nfs1' does not exist\n")
    assert pve("get", "/storage/1bad") == Result(
        255,
        "",
        "400 Parameter verification failed.\n"
        "storage: invalid format - storage ID '1bad' contains illegal characters\n"
        "pvesh get <api_path> [FORMAT_OPTIONS]\n",
    )


def test_storage_update_keeps_the_other_content_types_and_checks_the_digest(pve: Pve) -> None:
    stale = pve("set", "/storage/local", "--content", "iso", "--digest", sha1("old"))
    update = pve(
        "set",
        "/storage/local",
        "--content",
        "iso,vztmpl,backup,snippets,import",
        "--digest",
        sha1(DEFAULT_CFG),
        "--output-format",
        "json",
    )

    prefix = "update storage failed: "
    assert stale == Result(
        255, "", f"{prefix}detected modified configuration - file changed by other user? Try again.\n"
    )
    assert update == Result(0, '{"storage":"local","type":"dir"}\n', "")
    assert pve.file("etc/pve/storage.cfg") == (
        "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup,snippets,import\n\n"
        "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir,images\n\n"
    )
    assert pve.json("get", "/storage/local")["content"] == "iso,vztmpl,backup,snippets,import"


@pytest.mark.parametrize(
    ("args", "stderr"),
    [
        pytest.param(
            ["/storage/local-lvm", "--content", "snippets"],
            "storage does not support content type 'snippets'\n"
            "update storage failed: storage does not support content type 'none'\n",
            id="lvmthin-snippets",
        ),
        pytest.param(
            ["/storage/local", "--content", "none,iso"],
            "update storage failed: unable to combine 'none' with other content types\n",
            id="none-and-more",
        ),
        pytest.param(
            ["/storage/local", "--delete", "path"],
            "update storage failed: unable to delete required option 'path'\n",
            id="delete-path",
        ),
        pytest.param(
            ["/storage/nfs1", "--content", "iso"],
            "update storage failed: storage 'nfs1' does not exist\n",
            id="gone",
        ),
        pytest.param(
            ["/storage/local", "--content", "isos"],
            "400 Parameter verification failed.\ncontent: invalid format - invalid content type 'isos'\n"
            + usage("set"),
            id="unknown-type",
        ),
    ],
)
def test_storage_update_refusals(pve: Pve, args: list[str], stderr: str) -> None:
    assert pve("set", *args) == Result(255, "", stderr)
    assert not (pve.root / "etc/pve/storage.cfg").exists()


def test_storage_content_lists_the_enabled_types_sorted_by_volid(pve: Pve) -> None:
    enable(pve, "iso,vztmpl,backup,snippets,import")
    pve.write("var/lib/vz/import/debian-12.qcow2", qcow2(2 * GIB))
    pve.write("var/lib/vz/import/notes.txt", "not an image")
    pve.write("var/lib/vz/snippets/pvegpu-100-user.yaml", "#cloud-config\n")
    pve.write("var/lib/vz/template/iso/Debian.ISO", "iso")
    pve("create", "/nodes/pve1/qemu", "--vmid", "100", "--scsi0", "local-lvm:32")

    listed = pve.json("get", "/nodes/pve1/storage/local/content")
    images = pve.json("get", "/nodes/pve1/storage/local-lvm/content", "--content", "images")

    assert [(v["volid"], v["format"], v["content"], v["size"]) for v in listed] == [
        ("local:import/debian-12.qcow2", "qcow2", "import", 41),
        ("local:iso/Debian.ISO", "iso", "iso", 3),
        ("local:snippets/pvegpu-100-user.yaml", "snippet", "snippets", 14),
    ]
    assert all(isinstance(v["ctime"], int) for v in listed)
    assert [(v["volid"], v["format"], v["size"], v["vmid"]) for v in images] == [
        ("local-lvm:vm-100-disk-0", "raw", 32 * GIB, 100)
    ]
    assert pve.json("get", "/nodes/pve1/storage/local/content", "--content", "images") == []


# --- download-url ------------------------------------------------------------------------------------


@pytest.fixture
def web(tmp_path: Path) -> Iterator[str]:
    """A local HTTP server for tmp_path/www (the lab's image server stands for the internet)."""
    folder = tmp_path / "www"
    folder.mkdir()
    (folder / "debian-12-genericcloud-amd64.qcow2").write_bytes(qcow2(3 * GIB))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


IMAGE = "debian-12-genericcloud-amd64.qcow2"
DEST = f"/var/lib/vz/import/{IMAGE}"


def download(pve: Pve, url: str, *extra: str) -> Result:
    return pve(
        "create", "/nodes/pve1/storage/local/download-url", "--url", url, "--content", "import",
        "--filename", IMAGE, *extra, "--output-format", "json",
    )  # fmt: skip


def test_download_url_fetches_into_import_verifies_the_checksum_and_keeps_the_file(
    pve: Pve, web: str
) -> None:
    enable(pve, "iso,vztmpl,backup,import")
    url = f"{web}/{IMAGE}"
    checksum = hashlib.sha512(qcow2(3 * GIB)).hexdigest()

    first = download(pve, url, "--checksum", checksum.upper(), "--checksum-algorithm", "sha512")
    again = download(pve, url, "--checksum", checksum, "--checksum-algorithm", "sha512")
    unchecked = download(pve, url)

    assert first.out.splitlines()[:-1] == [
        f"downloading {url} to {DEST}",
        "calculating checksum...OK, checksum verified",
        f"download of '{url}' to '{DEST}' finished",
    ]
    assert pve.task(first, "download", IMAGE)["exitstatus"] == "OK"
    assert (pve.root / DEST.lstrip("/")).read_bytes() == qcow2(3 * GIB)
    assert sorted(p.name for p in (pve.root / "var/lib/vz/import").iterdir()) == [IMAGE]
    assert again.out.splitlines()[:-1] == [
        f"downloading {url} to {DEST}",
        "calculating checksum of existing file...OK, got correct file already, no need to download",
    ]
    assert pve.task(again, "download", IMAGE)["exitstatus"] == "OK"
    assert unchecked.err == f"refusing to override existing file '{DEST}'\n"
    assert pve.json("get", "/nodes/pve1/storage/local/content", "--content", "import")[0]["volid"] == (
        f"local:import/{IMAGE}"
    )


def test_download_url_refuses_a_wrong_checksum_naming_both_sums(pve: Pve, web: str) -> None:
    enable(pve, "import")
    got = hashlib.sha256(qcow2(3 * GIB)).hexdigest()
    wrong = "ab" * 32

    result = download(pve, f"{web}/{IMAGE}", "--checksum", wrong, "--checksum-algorithm", "sha256")

    error = f"checksum mismatch: got '{got}' != expect '{wrong}'"
    assert result.out.splitlines()[1] == "calculating checksum..."
    assert (result.rc, result.err) == (0, error + "\n")
    assert pve.task(result, "download", IMAGE)["exitstatus"] == error
    assert list((pve.root / "var/lib/vz/import").iterdir()) == []

    pve.write(DEST, b"an older image")
    stale = download(pve, f"{web}/{IMAGE}", "--checksum", got, "--checksum-algorithm", "sha256")
    old = hashlib.sha256(b"an older image").hexdigest()
    assert stale.err == f"checksum mismatch: got '{old}' != expect '{got}', aborting\n"


def test_download_url_reports_a_failed_fetch_as_wget_does(pve: Pve, web: str) -> None:
    enable(pve, "import")
    result = download(pve, f"{web}/missing.qcow2")
    match = re.fullmatch(
        rf"download failed: command 'wget --progress=dot:giga -O {DEST}\.tmp_dwnl\.\d+ {web}/missing\.qcow2' "
        r"failed: exit code 8\n",
        result.err,
    )
    assert match is not None, result


@pytest.mark.parametrize(
    ("storage", "args", "stderr"),
    [
        pytest.param(
            "local",
            [],
            "storage 'local' is not configured for content-type 'import'\n",
            id="no-import-content",
        ),
        pytest.param(
            "local-lvm",
            [],
            "can't upload to storage type 'lvmthin', not a file based storage!\n",
            id="lvmthin",
        ),
        pytest.param("nfs1", [], "storage 'nfs1' does not exist\n", id="no-storage"),
        pytest.param(
            "local",
            ["--filename", "ubuntu-24.04-server-cloudimg-amd64.img"],
            "400 Parameter verification failed.\nfilename: invalid filename or wrong extension\n",
            id="img-not-an-import-extension",
        ),
        pytest.param(
            "local",
            ["--checksum", "ab"],
            "400 Parameter verification failed.\n"
            "checksum-algorithm: missing property required by 'checksum'\n",
            id="checksum-without-algorithm",
        ),
        pytest.param(
            "local",
            ["--url", "ftp://x/y.qcow2"],
            "400 Parameter verification failed.\nurl: value does not match the regex pattern\n",
            id="url",
        ),
    ],
)
def test_download_url_refusals_before_the_task(pve: Pve, storage: str, args: list[str], stderr: str) -> None:
    if storage == "local" and args:
        enable(pve, "import")
    options = {"--url": "http://127.0.0.1:9/x.qcow2", "--content": "import", "--filename": IMAGE}
    options.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = pve(
        "create", f"/nodes/pve1/storage/{storage}/download-url", *(x for kv in options.items() for x in kv)
    )
    required = "--content <iso | vztmpl | import> --filename <string> --url <string> "
    expected = stderr + (usage("create", required) if stderr.startswith("400") else "")
    assert result == Result(255, "", expected)


# --- import-from, resize ---------------------------------------------------------------------------------


SOURCE = f"local:import/{IMAGE}"
IMPORTED = ("--scsi0", f"local-lvm:0,import-from={SOURCE},iothread=1")
EFI = ("--efidisk0", "local-lvm:1,efitype=4m,pre-enrolled-keys=0")


def test_import_from_copies_the_image_into_a_new_volume_of_its_virtual_size(pve: Pve) -> None:
    enable(pve, "iso,vztmpl,backup,import")
    pve.write(DEST, qcow2(3 * GIB))

    create = pve("create", "/nodes/pve1/qemu", "--vmid", "100", *IMPORTED, *EFI, "--output-format", "json")

    assert create.out.splitlines()[:-1] == [
        "efidisk0: successfully created disk "
        "'local-lvm:vm-100-disk-0,efitype=4m,pre-enrolled-keys=0,size=4M'",
        f"create full clone of drive ({SOURCE})",
        "scsi0: successfully created disk 'local-lvm:vm-100-disk-1,iothread=1,size=3G'",
    ]
    assert pve.task(create, "qmcreate")["exitstatus"] == "OK"
    volumes = pve.root / "var/lib/pvegpu-lab/volumes/local-lvm"
    assert (volumes / "vm-100-disk-1").read_bytes() == qcow2(3 * GIB)
    assert (volumes / "vm-100-disk-0").read_bytes() == b""

    grow = pve(
        "set", "/nodes/pve1/qemu/100/resize", "--disk", "scsi0", "--size", "32G", "--output-format", "json"
    )
    more = pve(
        "set", "/nodes/pve1/qemu/100/resize", "--disk", "scsi0", "--size", "+512M", "--output-format", "json"
    )
    shrink = pve(
        "set", "/nodes/pve1/qemu/100/resize", "--disk", "scsi0", "--size", "8G", "--output-format", "json"
    )
    missing = pve(
        "set", "/nodes/pve1/qemu/100/resize", "--disk", "scsi1", "--size", "8G", "--output-format", "json"
    )

    assert (pve.task(grow, "resize")["exitstatus"], grow.err) == ("OK", "")
    assert pve.task(more, "resize")["exitstatus"] == "OK"
    assert (
        pve.json("get", "/nodes/pve1/qemu/100/config")["scsi0"]
        == "local-lvm:vm-100-disk-1,iothread=1,size=33280M"
    )
    assert (shrink.err, pve.task(shrink, "resize")["exitstatus"]) == (
        "shrinking disks is not supported\n",
        "shrinking disks is not supported",
    )
    assert missing.err == "disk 'scsi1' does not exist\n"


def test_import_from_on_a_directory_storage_keeps_the_image_format(pve: Pve) -> None:
    enable(pve, "images,import")
    pve.write(DEST, qcow2(2 * GIB))

    create = pve("create", "/nodes/pve1/qemu", "--vmid", "100", "--scsi0", f"local:0,import-from={SOURCE}")

    assert (
        create.out.splitlines()[1]
        == "scsi0: successfully created disk 'local:100/vm-100-disk-0.qcow2,size=2G'"
    )
    assert (pve.root / "var/lib/vz/images/100/vm-100-disk-0.qcow2").read_bytes() == qcow2(2 * GIB)


@pytest.mark.parametrize(
    ("drive", "stderr"),
    [
        pytest.param(
            ["--scsi0", f"local-lvm:32,import-from={SOURCE}"],
            "400 Parameter verification failed.\n"
            "scsi0: 'import-from' requires special syntax - use <storage ID>:0,import-from=<source>\n",
            id="size-not-zero",
        ),
        pytest.param(
            ["--efidisk0", f"local-lvm:0,import-from={SOURCE},efitype=4m"],
            "400 Parameter verification failed.\n"
            "efidisk0: need to specify 'pre-enrolled-keys' when using 'import-from'\n",
            id="efidisk-without-pre-enrolled-keys",
        ),
        pytest.param(
            ["--scsi0", "local-lvm:0,import-from=local:iso/debian.iso"],
            "400 Parameter verification failed.\n"
            "scsi0: local:iso/debian.iso has wrong type 'iso' - needs to be 'images' or 'import'\n",
            id="iso-source",
        ),
        pytest.param(
            ["--scsi0", f"local:0,import-from={SOURCE}"],
            "400 Parameter verification failed.\nstorage: storage 'local' does not support vm images\n",
            id="target-without-images",
        ),
        pytest.param(
            ["--scsi0", "nfs1:0,import-from=nfs1:import/x.qcow2"],
            "storage 'nfs1' does not exist\n",
            id="no-storage",
        ),
    ],
)
def test_import_from_refusals_before_the_task(pve: Pve, drive: list[str], stderr: str) -> None:
    result = pve("create", "/nodes/pve1/qemu", "--vmid", "100", *drive)
    required = "--vmid <integer> (100 - 999999999) "
    assert result == Result(255, "", stderr + (usage("create", required) if stderr.startswith("400") else ""))
    assert not (pve.root / "etc/pve/qemu-server/100.conf").exists()


def test_import_from_a_missing_image_fails_the_task_and_frees_what_it_made(pve: Pve) -> None:
    result = pve("create", "/nodes/pve1/qemu", "--vmid", "100", *EFI, *IMPORTED, "--output-format", "json")

    error = f"unable to create VM 100 - failed to stat '{DEST}'"
    assert (result.err, pve.task(result, "qmcreate")["exitstatus"]) == (error + "\n", error)
    assert not (pve.root / "etc/pve/qemu-server/100.conf").exists()
    assert list((pve.root / "var/lib/pvegpu-lab/volumes/local-lvm").iterdir()) == []


# --- cloud-init keys -------------------------------------------------------------------------------------


def test_cloud_init_drive_and_keys_are_stored_as_given(pve: Pve) -> None:
    keys = urllib.parse.quote(f"{KEY}\n", safe="")
    create = pve(
        "create", "/nodes/pve1/qemu", "--vmid", "100", "--ide2", "local-lvm:cloudinit", "--ciuser", "root",
        "--cipassword", "s3cret", "--sshkeys", keys, "--ipconfig0", "ip=10.200.3.2/24,gw=10.200.3.1",
        "--nameserver", "10.200.3.1 1.1.1.1", "--ciupgrade", "0", "--citype", "nocloud",
        "--cicustom", "user=local:snippets/pvegpu-100-user.yaml", "--output-format", "json",
    )  # fmt: skip

    assert (
        create.out.splitlines()[0]
        == "ide2: successfully created disk 'local-lvm:vm-100-cloudinit,media=cdrom'"
    )
    assert (pve.root / "var/lib/pvegpu-lab/volumes/local-lvm/vm-100-cloudinit").is_file()
    config = pve.json("get", "/nodes/pve1/qemu/100/config")
    assert {k: config[k] for k in ("boot", "cipassword", "ciupgrade", "sshkeys", "ipconfig0")} == {
        "boot": "order=ide2",
        "cipassword": "**********",
        "ciupgrade": 0,
        "sshkeys": keys,
        "ipconfig0": "ip=10.200.3.2/24,gw=10.200.3.1",
    }
    update = pve(
        "set", "/nodes/pve1/qemu/100/config", "--cipassword", "other", "--ide3", "local-lvm:cloudinit"
    )
    assert update == Result(
        255,
        "update VM 100: -cipassword <hidden> -ide3 local-lvm:cloudinit\n",
        "ide3 - cloud-init drive is already attached at 'ide2'\n",
    )


@pytest.mark.parametrize(
    ("args", "stderr"),
    [
        pytest.param(
            ["--sshkeys", KEY],
            "400 Parameter verification failed.\n"
            f"sshkeys: invalid format - invalid urlencoded string: {KEY}\n",
            id="sshkeys-not-encoded",
        ),
        pytest.param(
            ["--sshkeys", urllib.parse.quote("ssh-ed25519 AAAAnotakey op@laptop\n", safe="")],
            "SSH public key validation error\n",
            id="sshkeys-not-a-key",
        ),
        pytest.param(
            ["--ipconfig0", "gw=10.0.0.1"],
            "400 Parameter verification failed.\nipconfig0.ip: missing property required by 'ipconfig0.gw'\n",
            id="gw-without-ip",
        ),
        pytest.param(
            ["--ipconfig0", "ip=10.0.0.5"],
            "400 Parameter verification failed.\n"
            "ipconfig0.ip: invalid format - value does not look like a valid ipv4 network configuration\n",
            id="ip-without-prefix",
        ),
        pytest.param(
            ["--ipconfig0", "dhcp"],
            "400 Parameter verification failed.\n"
            "ipconfig0: invalid format - value without key, but schema does not define a default key\n",
            id="ipconfig-without-key",
        ),
        pytest.param(
            ["--nameserver", "10.0.0.1 bad_name"],
            "400 Parameter verification failed.\n"
            "nameserver: invalid format - value does not look like a valid address: bad_name\n",
            id="nameserver",
        ),
        pytest.param(
            ["--cicustom", "user=snippets/x.yaml"],
            "400 Parameter verification failed.\n"
            "cicustom.user: invalid format - unable to parse volume ID 'snippets/x.yaml'\n",
            id="cicustom-not-a-volume",
        ),
        pytest.param(
            ["--citype", "cloudbase"],
            "400 Parameter verification failed.\n"
            "citype: value 'cloudbase' does not have a value in the enumeration "
            "'configdrive2, nocloud, opennebula'\n",
            id="citype",
        ),
    ],
)
def test_cloud_init_keys_are_checked_as_proxmox_checks_them(pve: Pve, args: list[str], stderr: str) -> None:
    result = pve("create", "/nodes/pve1/qemu", "--vmid", "100", *args)
    required = "--vmid <integer> (100 - 999999999) "
    assert result == Result(255, "", stderr + (usage("create", required) if stderr.startswith("400") else ""))


# --- start: what the lab hypervisor is asked ------------------------------------------------------------


def _start(pve: Pve) -> Result:
    return pve("create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json")


def test_start_hands_the_hypervisor_the_boot_disk_and_the_custom_user_data(pve: Pve) -> None:
    enable(pve, "iso,vztmpl,backup,import,snippets")
    pve.write(DEST, qcow2(3 * GIB))
    user_data = "#cloud-config\nhostname: llm\n"
    pve.write("var/lib/vz/snippets/pvegpu-100-user.yaml", user_data)
    pve(
        "create", "/nodes/pve1/qemu", "--vmid", "100", "--name", "llm", "--machine", "q35", "--bios", "ovmf",
        *EFI, *IMPORTED, "--ide2", "local-lvm:cloudinit", "--net0", "virtio,bridge=vmbr0",
        "--ipconfig0", "ip=dhcp", "--cicustom", "user=local:snippets/pvegpu-100-user.yaml", "--agent", "1",
    )  # fmt: skip
    mac = pve.json("get", "/nodes/pve1/qemu/100/config")["net0"].split(",")[0].split("=")[1]

    start = _start(pve)

    assert (start.err, pve.task(start, "qmstart")["exitstatus"]) == ("", "OK")
    assert pve.hypervisor.requests == [
        {
            "action": "start",
            "vmid": 100,
            "name": "llm",
            "machine": "q35",
            "bios": "ovmf",
            "devices": [],
            "virtiofs": [],
            "disk": {
                "key": "scsi0",
                "volume": "local-lvm:vm-100-disk-1",
                "path": "/var/lib/pvegpu-lab/volumes/local-lvm/vm-100-disk-1",
            },
            "cloud_init": {"user_data": user_data, "ipconfig0": "ip=dhcp", "hostname": "llm", "mac": mac},
            "mac": mac,
            "config": dict(
                line.split(": ", 1) for line in pve.file("etc/pve/qemu-server/100.conf").splitlines()
            ),
        }
    ]
    assert pve.json("get", "/nodes/pve1/qemu/100/status/current")["status"] == "running"


def test_start_without_cicustom_hands_proxmoxs_generated_user_data(pve: Pve) -> None:
    keys = urllib.parse.quote(f"{KEY}\n\n", safe="")
    pve(
        "create", "/nodes/pve1/qemu", "--vmid", "100", "--name", "llm.lab.example",
        "--ide2", "local-lvm:cloudinit",
        "--ciuser", "root", "--sshkeys", keys, "--ciupgrade", "0",
    )  # fmt: skip

    assert (_start(pve).err, len(pve.hypervisor.requests)) == ("", 1)
    request = pve.hypervisor.requests[0]
    assert (request["bios"], request["machine"], request["disk"]) == ("seabios", "pc", None)
    assert request["cloud_init"] == {
        "user_data": "#cloud-config\nhostname: llm\nmanage_etc_hosts: true\nfqdn: llm.lab.example\n"
        "user: root\n"
        f"disable_root: False\nssh_authorized_keys:\n  - {KEY}\nchpasswd:\n  expire: False\n",
        "ipconfig0": None,
        "hostname": "llm",
        "mac": None,
    }


@pytest.mark.parametrize(
    ("cicustom", "error"),
    [
        pytest.param(
            "user=local:snippets/gone.yaml", "can't find file 'local:snippets/gone.yaml'", id="missing"
        ),
        pytest.param(
            "user=local:iso/seed.iso",
            "local:iso/seed.iso is not in the snippets directory",
            id="not-a-snippet",
        ),
        pytest.param(
            "vendor=local-lvm:snippets/v.yaml",
            "unable to parse lvm volume name 'snippets/v.yaml'",
            id="lvm-storage",
        ),
    ],
)
def test_start_fails_in_the_task_when_a_cicustom_file_cannot_be_read(
    pve: Pve, cicustom: str, error: str
) -> None:
    pve.write("var/lib/vz/template/iso/seed.iso", "iso")
    pve(
        "create", "/nodes/pve1/qemu", "--vmid", "100", "--ide2", "local-lvm:cloudinit", "--cicustom", cicustom
    )

    start = _start(pve)

    assert (start.err, pve.task(start, "qmstart")["exitstatus"]) == (error + "\n", error)
    assert pve.hypervisor.requests == []


# --- guest agent -----------------------------------------------------------------------------------------


AGENT = "/nodes/pve1/qemu/100/agent"


def test_agent_answers_from_the_hypervisors_file_once_the_guest_agent_runs(pve: Pve) -> None:
    pve("create", "/nodes/pve1/qemu", "--vmid", "100", "--agent", "1")
    assert pve("get", f"{AGENT}/network-get-interfaces") == Result(255, "", "VM 100 is not running\n")
    _start(pve)
    assert pve("get", f"{AGENT}/network-get-interfaces") == Result(
        255, "", "QEMU guest agent is not running\n"
    )
    interfaces = {
        "result": [
            {
                "name": "eth0",
                "hardware-address": "bc:24:11:00:00:01",
                "ip-addresses": [{"ip-address": "10.200.3.2", "ip-address-type": "ipv4", "prefix": 24}],
            }
        ]
    }
    pve.write("var/lib/pvegpu-lab/agent/100.json", json.dumps(interfaces))

    assert pve.json("get", f"{AGENT}/network-get-interfaces") == interfaces
    assert pve.json("get", f"{AGENT}/get-fsinfo") == {"result": {"echo": "get-fsinfo"}}
    assert pve.json("get", f"{AGENT}/file-read", "--file", "/etc/hostname") == {"echo": "file-read"}
    encoded = base64.b64encode(b"hello\n").decode()
    assert pve(
        "create", f"{AGENT}/file-write", "--file", "/tmp/x", "--content", encoded, "--encode", "0"
    ) == Result(0, "", "")
    assert pve.json("create", f"{AGENT}/exec", "--command", "ls", "--command", "-l") == {"echo": "exec"}
    assert pve.json("get", f"{AGENT}/exec-status", "--pid", "7") == {"echo": "exec-status"}
    assert pve("create", f"{AGENT}/exec", "--command", "false") == Result(
        255, "", "Agent error: Failed to execute child process \u201cfalse\u201d\n"
    )
    agent_requests = [r for r in pve.hypervisor.requests if r["action"] == "agent"]
    assert [(r["vmid"], r["command"], r["params"]) for r in agent_requests] == [
        (100, "get-fsinfo", {}),
        (100, "file-read", {"file": "/etc/hostname"}),
        (100, "file-write", {"file": "/tmp/x", "content": "hello\n"}),
        (100, "exec", {"command": ["ls", "-l"]}),
        (100, "exec-status", {"pid": 7}),
        (100, "exec", {"command": ["false"]}),
    ]


def test_agent_needs_the_agent_key(pve: Pve) -> None:
    pve("create", "/nodes/pve1/qemu", "--vmid", "100")
    assert pve("get", f"{AGENT}/get-fsinfo") == Result(255, "", "No QEMU guest agent configured\n")
