"""The cloud-image steps (`storage_content`, `image_downloaded`, `snippet_file`, `disk_grown`): API state in
-> exact API calls out when executed, or the noop sentence, or the one error line. Answers follow
proxmox-cloudinit-import.md and proxmox-api-behaviour.md (storage content as a comma list with a digest,
download-url as a task whose failure is its exitstatus)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import Sha256File

from pvegpu.facts.node_read import ImageDigest, NodeRead
from pvegpu.operations.cloud_image import (
    disk_grown,
    disk_size_gib,
    image_downloaded,
    snippet_file,
    storage_content,
)
from pvegpu.operations.files import install_staged
from pvegpu.operations.pve_guest import VM, Guest
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import FakeApi, execute, sequence, task_ok
from tests.unit.op_harness import node_state, run_op

UPID_DL = "UPID:pve1:0000B1B2:0153F2C4:66A1B2C5:download:debian-12-genericcloud-amd64.qcow2:root@pam:"
VOLID = "local:import/debian-12-genericcloud-amd64.qcow2"
URL = "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2"
SUM = "a" * 128
CONTENT = "/nodes/pve1/storage/local/content"
MISMATCH = f"checksum mismatch: got '{'b' * 128}' != expect '{SUM}'"


def local_storage(content: str, digest: str = "s1") -> dict[str, object]:
    return {"storage": "local", "type": "dir", "path": "/var/lib/vz", "content": content, "digest": digest}


def test_storage_with_every_wanted_type_is_left_alone() -> None:
    api = FakeApi({("GET", "/storage/local"): local_storage("iso,vztmpl,backup,snippets,import")})
    commands, noops = run_op(
        storage_content, {}, api=api.client, storage="local", wanted=["import", "snippets"]
    )
    assert commands == []
    assert noops == ["storage local offers import, snippets"]


def test_missing_types_are_added_to_the_storage_own_with_its_digest() -> None:
    reads = sequence(
        local_storage("iso,vztmpl,backup"), local_storage("iso,vztmpl,backup,import,snippets", "s2")
    )
    api = FakeApi({("GET", "/storage/local"): reads, ("PUT", "/storage/local"): None})
    commands, _ = run_op(storage_content, {}, api=api.client, storage="local", wanted=["import", "snippets"])
    execute(commands)
    assert api.writes() == [
        ("PUT", "/storage/local", {"content": "iso,vztmpl,backup,import,snippets", "digest": "s1"})
    ]


def test_a_content_write_that_changed_nothing_is_an_error() -> None:
    reads = sequence(local_storage("iso"), local_storage("iso", "s2"))
    api = FakeApi({("GET", "/storage/local"): reads, ("PUT", "/storage/local"): None})
    commands, _ = run_op(storage_content, {}, api=api.client, storage="local", wanted=["snippets"])
    with pytest.raises(OperationError) as error:
        execute(commands)
    assert str(error.value) == (
        "storage local: content type snippets not added: reading it back shows content iso"
    )


def volumes(*volids: str) -> list[dict[str, object]]:
    return [{"volid": v, "content": "import", "format": "qcow2", "size": 3 << 30} for v in volids]


def download(**changes: Any) -> dict[str, Any]:
    return {
        "api": None,
        "node": "pve1",
        "volid": VOLID,
        "url": URL,
        "checksum": SUM,
        "algorithm": "sha512",
        "timeout_s": 60,
        **changes,
    }


IMAGE_PATH = "/var/lib/vz/import/debian-12-genericcloud-amd64.qcow2"


def hashed(digest: str | None, algorithm: str = "sha512") -> dict[type, object]:
    """The node read having hashed the image file at IMAGE_PATH (`digest` None: no such file)."""
    digests = {} if digest is None else {IMAGE_PATH: digest}
    return {NodeRead: node_state(image_algorithms={IMAGE_PATH: algorithm}, image_digests=digests)}


def on_the_node() -> FakeApi:
    return FakeApi({("GET", CONTENT): volumes(VOLID), ("GET", "/storage/local"): local_storage("import")})


def test_an_image_already_on_the_node_with_the_checksum_is_not_downloaded_again() -> None:
    api = on_the_node()
    commands, noops = run_op(image_downloaded, hashed(SUM), **download(api=api.client))
    assert (commands, noops) == ([], [f"image {VOLID} is on pve1 with the sha512 of vm.image.checksum"])
    assert api.calls == [("GET", CONTENT, {"content": "import"}), ("GET", "/storage/local", {})]


def test_the_stale_image_volume_is_refused_naming_both_sums() -> None:
    api = on_the_node()
    stale = "b" * 128
    with pytest.raises(OperationError) as error:
        run_op(image_downloaded, hashed(stale), **download(api=api.client))
    assert str(error.value) == (
        f"vm.image: volume {VOLID} ({IMAGE_PATH}) on pve1 has sha512 {stale}, vm.image.checksum is {SUM}: "
        f"remove the volume (pvesm free {VOLID}) or fix vm.image.checksum"
    )
    assert api.writes() == []


def test_an_image_the_read_did_not_hash_is_hashed_on_its_own() -> None:
    """The VM's config existed at the read (the leftover of a dead create): the image was not hashed then."""
    api = on_the_node()
    facts = {NodeRead: node_state(), ImageDigest: "a" * 64}
    commands, noops = run_op(
        image_downloaded, facts, **download(api=api.client, checksum="a" * 64, algorithm="sha256")
    )
    assert (commands, noops) == ([], [f"image {VOLID} is on pve1 with the sha256 of vm.image.checksum"])


def test_a_listed_volume_without_its_file_is_refused() -> None:
    api = on_the_node()
    with pytest.raises(OperationError) as error:
        run_op(image_downloaded, hashed(None), **download(api=api.client))
    assert str(error.value) == (
        f"vm.image: volume {VOLID} is listed on pve1, but {IMAGE_PATH} is not a file: its sha512 cannot be "
        "checked"
    )


def test_a_volume_given_by_name_is_used_unchecked() -> None:
    api = FakeApi({("GET", CONTENT): volumes(VOLID)})
    commands, noops = run_op(
        image_downloaded, {}, **download(api=api.client, url=None, checksum=None, algorithm=None)
    )
    assert (commands, noops) == ([], [f"image {VOLID} is on pve1"])
    assert api.calls == [("GET", CONTENT, {"content": "import"})]


def test_a_missing_image_is_downloaded_with_its_checksum_and_read_back() -> None:
    api = FakeApi(
        {
            ("GET", CONTENT): sequence(volumes(), volumes(VOLID)),
            ("POST", "/nodes/pve1/storage/local/download-url"): UPID_DL,
            ("GET", f"/nodes/pve1/tasks/{UPID_DL}/status"): task_ok(UPID_DL),
        }
    )
    commands, _ = run_op(image_downloaded, {}, **download(api=api.client))
    execute(commands)
    assert api.writes() == [
        (
            "POST",
            "/nodes/pve1/storage/local/download-url",
            {
                "url": URL,
                "filename": "debian-12-genericcloud-amd64.qcow2",
                "content": "import",
                "checksum": SUM,
                "checksum-algorithm": "sha512",
                "verify-certificates": 1,
            },
        )
    ]


def test_a_wrong_checksum_names_the_url_and_both_sums() -> None:
    failed = {"upid": UPID_DL, "status": "stopped", "exitstatus": MISMATCH}
    api = FakeApi(
        {
            ("GET", CONTENT): volumes(),
            ("POST", "/nodes/pve1/storage/local/download-url"): UPID_DL,
            ("GET", f"/nodes/pve1/tasks/{UPID_DL}/status"): failed,
        }
    )
    commands, _ = run_op(image_downloaded, {}, **download(api=api.client))
    with pytest.raises(OperationError) as error:
        execute(commands)
    assert str(error.value) == f"vm.image.url {URL}: not downloaded: {MISMATCH}"


def test_a_missing_volume_given_by_name_is_an_error_naming_it() -> None:
    api = FakeApi({("GET", CONTENT): volumes()})
    with pytest.raises(OperationError) as error:
        run_op(image_downloaded, {}, **download(api=api.client, url=None, checksum=None, algorithm=None))
    assert str(error.value) == f"vm.image.volume: {VOLID} does not exist on pve1"


def test_the_snippet_is_written_root_only_when_its_checksum_differs() -> None:
    content = "#cloud-config\nhostname: llm\n"
    path = "/var/lib/vz/snippets/pvegpu-100-user.yaml"
    same = hashlib.sha256(content.encode()).hexdigest()
    found = {NodeRead: node_state(files_sha256={path: same})}
    assert run_op(snippet_file, found, path=path, content=content) == (
        [],
        [f"cloud-init user-data {path} is up to date"],
    )
    commands, _ = run_op(snippet_file, {NodeRead: node_state(files_sha256={})}, path=path, content=content)
    staged = "/var/lib/vz/snippets/.pvegpu-100-user.yaml.pvegpu-new"
    prepare, upload, install = commands
    assert prepare == (
        f"mkdir -p /var/lib/vz/snippets && rm -f {staged} && ( umask 077 && : > {staged} ) || "
        "{ echo 'pvegpu: could not stage /var/lib/vz/snippets/pvegpu-100-user.yaml (left unchanged)' >&2 ; "
        "exit 1 ; }"
    )
    assert isinstance(upload, FileUploadCommand)
    assert (upload.src.getvalue(), upload.dest) == (content.encode(), staged)  # type: ignore[union-attr]
    assert install == install_staged(path, same, mode="0600").get_raw_value()


def test_the_snippet_with_a_private_key_is_never_on_a_command_line() -> None:
    body = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
    content = (
        "#cloud-config\nssh_keys:\n  ed25519_private: |\n    -----BEGIN OPENSSH PRIVATE KEY-----\n"
        f"    {body}\n    -----END OPENSSH PRIVATE KEY-----\n"
    )
    path = "/var/lib/vz/snippets/pvegpu-100-user.yaml"
    commands, _ = run_op(snippet_file, {NodeRead: node_state(files_sha256={})}, path=path, content=content)
    shell = [command for command in commands if isinstance(command, str)]
    assert len(shell) == 2
    assert [line for line in shell if body in line or "PRIVATE KEY" in line] == []


def test_a_snippet_outside_the_storages_the_node_read_saw_is_read_on_its_own() -> None:
    content = "#cloud-config\nhostname: llm\n"
    path = "/srv/elsewhere/snippets/pvegpu-100-user.yaml"  # not in the read's storage.cfg directories
    same = hashlib.sha256(content.encode()).hexdigest()
    facts = {NodeRead: node_state(), Sha256File: same}
    assert run_op(snippet_file, facts, path=path, content=content) == (
        [],
        [f"cloud-init user-data {path} is up to date"],
    )


def vm_config(scsi0: str, digest: str = "c1") -> dict[str, object]:
    return {"scsi0": scsi0, "digest": digest}


@pytest.mark.parametrize(
    ("value", "gib"),
    [("local-lvm:vm-100-disk-1,iothread=1,size=2G", 2.0), ("x,size=512M", 0.5), ("x,size=1T", 1024.0)],
)
def test_disk_size_is_read_from_the_property_string(value: str, gib: float) -> None:
    assert disk_size_gib(value) == gib


def test_an_imported_disk_is_grown_to_its_size_and_read_back() -> None:
    config = "/nodes/pve1/qemu/100/config"
    api = FakeApi(
        {
            ("GET", config): sequence(
                vm_config("local-lvm:vm-100-disk-1,iothread=1,size=2G"),
                vm_config("local-lvm:vm-100-disk-1,iothread=1,size=32G", "c2"),
            ),
            ("PUT", "/nodes/pve1/qemu/100/resize"): None,
        }
    )
    commands, _ = run_op(disk_grown, {}, guest=Guest(VM, api.client, "pve1", 100), disk="scsi0", size_gib=32)
    execute(commands)
    assert api.writes() == [
        ("PUT", "/nodes/pve1/qemu/100/resize", {"disk": "scsi0", "size": "32G", "digest": "c1"})
    ]


def test_a_vm_made_later_in_the_run_is_read_when_the_grow_executes() -> None:
    """`--dry` on a new node: the VM does not exist while preparing; the grow reads it once it is made."""
    config = "/nodes/pve1/qemu/100/config"
    missing = PveError(500, "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist")
    api = FakeApi(
        {
            ("GET", config): sequence(
                missing,
                vm_config("local-lvm:vm-100-disk-1,iothread=1,size=2G"),
                vm_config("local-lvm:vm-100-disk-1,iothread=1,size=32G", "c2"),
            ),
            ("PUT", "/nodes/pve1/qemu/100/resize"): None,
        }
    )
    commands, noops = run_op(
        disk_grown, {}, guest=Guest(VM, api.client, "pve1", 100), disk="scsi0", size_gib=32
    )
    assert (len(commands), noops) == (1, [])
    execute(commands)
    assert api.writes() == [
        ("PUT", "/nodes/pve1/qemu/100/resize", {"disk": "scsi0", "size": "32G", "digest": "c1"})
    ]


def test_a_disk_at_least_its_size_is_never_shrunk() -> None:
    api = FakeApi({("GET", "/nodes/pve1/qemu/100/config"): vm_config("x,size=64G")})
    commands, noops = run_op(
        disk_grown, {}, guest=Guest(VM, api.client, "pve1", 100), disk="scsi0", size_gib=32
    )
    assert (commands, noops) == ([], ["VM 100 scsi0 is 64 GiB (at least 32)"])


def test_an_api_error_while_reading_the_storage_names_it() -> None:
    api = FakeApi({("GET", "/storage/nas"): PveError(500, "storage 'nas' does not exist")})
    with pytest.raises(OperationError) as error:
        run_op(storage_content, {}, api=api.client, storage="nas", wanted=["snippets"])
    assert str(error.value) == "storage nas: GET /storage/nas: storage 'nas' does not exist"
