"""The node's one state read (pvegpu/facts/node_read.py): a real captured lab sample, the command run here
against each part's own fact, and the parser's refusals."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from pvegpu.facts.boot import BootLoader, KernelCmdline, parse_cmdline
from pvegpu.facts.cpu import CpuAndKernel
from pvegpu.facts.errors import FactParseError
from pvegpu.facts.hardware import PciHardware
from pvegpu.facts.host_driver import HostDriverFiles
from pvegpu.facts.model_store import ModelStoreRead
from pvegpu.facts.node_read import (
    ImageDigest,
    NodeStateRequest,
    files_sha256_command,
    node_read_command,
    parse_image_digest,
    parse_node_state,
)
from pvegpu.facts.pvegpu_boot import PvegpuBootFiles
from pvegpu.hook.bundle import BUNDLE_PATH
from pvegpu.models.boot import BootLoaderKind, CpuKernel
from pvegpu.models.host_driver import UnitState
from pvegpu.models.model_store import ModelRecord
from pvegpu.plan.host_driver import DRIVER_FILES, DRIVER_UNITS
from tests.unit.fuzz_targets import fixture

SAMPLE = fixture("node_state_lab_node.txt")
HOOK = "/var/lib/vz/snippets/pvegpu-hook"
USER_DATA = "/var/lib/vz/snippets/pvegpu-100-user.yaml"
HOOK_TEXT_SHA256 = hashlib.sha256(b"hook\n").hexdigest()


def run(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)


def test_lab_sample_parts() -> None:
    state = parse_node_state(SAMPLE)
    assert len(SAMPLE[SAMPLE.index("#pvegpu-node:hardware") + 1]) == 9692  # the listing: one line of base64
    nvidia = [function for function in state.hardware.functions if function.vendor == "10de"]
    assert (len(state.hardware.functions), len(state.hardware.numa_nodes), len(nvidia)) == (69, 2, 16)
    assert {function.driver for function in nvidia} == {"vfio-pci"}
    assert [function.address for function in nvidia if function.class_code >> 8 == 0x0300] == [
        "0000:41:00.0",
        "0000:51:00.0",
        "0000:61:00.0",
        "0000:71:00.0",
        "0000:c1:00.0",
        "0000:d1:00.0",
        "0000:e1:00.0",
        "0000:f1:00.0",
    ]
    assert state.cpu_kernel == CpuKernel(vendor="amd", release=(6, 18))
    assert state.boot.kind is BootLoaderKind.GRUB
    assert state.boot_files.grub_tokens == ("amd_iommu=on", "iommu=pt")
    assert state.driver.files == ()
    assert state.driver.units == (
        UnitState("sglang.service", enabled=False, active=False),
        UnitState("pvegpu-nvidia-devices.service", enabled=False, active=False),
        UnitState("nvidia-persistenced.service", enabled=False, active=False),
    )
    assert state.cmdline == (
        "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve",
        "root=/dev/mapper/pve-root",
        "ro",
        "amd_iommu=on",
        "iommu=pt",
        "quiet",
    )
    assert state.fixed_paths == (BUNDLE_PATH,)
    assert state.snippet_dirs == ("/var/lib/vz/snippets",)
    assert state.sha256(BUNDLE_PATH) == "4f6ad6a75c453f6e205ded9a8d67ec9435a78569d5badfcb806b0dc00f1450cb"
    assert state.sha256(USER_DATA) == "dc656fa7cc3a92e251cf3933281be7f9d166804bda6823d265968ecbd1d73bc9"
    assert state.sha256(HOOK) == "7e18fd648cea454de4e9a3a336abd07d1f840a42fb4f17a338a987e4cb29c89b"


def test_covered_paths_answer_absent_files_with_none_and_others_raise() -> None:
    state = parse_node_state(SAMPLE)
    assert state.sha256("/var/lib/vz/snippets/pvegpu-101-user.yaml") is None
    assert not state.covers("/var/lib/vz/snippets/user.yaml")  # not pvegpu's: the read did not look
    assert not state.covers("/mnt/pve/nfs1/snippets/pvegpu-hook")
    with pytest.raises(KeyError) as error:
        state.sha256("/mnt/pve/nfs1/snippets/pvegpu-hook")
    assert error.value.args == (
        "/mnt/pve/nfs1/snippets/pvegpu-hook is not in the node state read "
        "(pvegpu.run.node_state.node_request)",
    )


def test_one_command_here_gives_what_each_fact_gives(tmp_path: Path) -> None:
    """Run on this machine (its /sys, /proc/cmdline, no Proxmox): every part equals its own fact's answer."""
    present = tmp_path / "bundle.pyz"
    present.write_bytes(b"zip")
    request = NodeStateRequest(
        sysfs_root="/sys",
        cmdline_path="/proc/cmdline",
        driver_files=DRIVER_FILES,
        driver_units=DRIVER_UNITS,
        sha256_paths=(str(present), str(tmp_path / "absent")),
    )
    done = run(node_read_command(request))
    assert done.returncode == 0, done.stderr
    state = parse_node_state(done.stdout.splitlines())

    def fact(command: str) -> list[str]:
        return run(command).stdout.splitlines()

    assert state.hardware == PciHardware().process(fact(PciHardware().command("/sys")))
    assert state.cpu_kernel == CpuAndKernel().process(fact(CpuAndKernel().command()))
    assert state.boot == BootLoader().process(fact(BootLoader().command()))
    assert state.boot_files == PvegpuBootFiles().process(fact(PvegpuBootFiles().command()))
    assert state.driver == HostDriverFiles().process(
        fact(HostDriverFiles().command(DRIVER_FILES, DRIVER_UNITS))
    )
    assert state.cmdline == parse_cmdline(fact(KernelCmdline().command("/proc/cmdline")))
    assert state.sha256(str(present)) == hashlib.sha256(b"zip").hexdigest()
    assert state.sha256(str(tmp_path / "absent")) is None
    assert "/var/lib/vz/snippets" in state.snippet_dirs  # the `local` storage Proxmox assumes


def test_storage_cfg_paths_are_scanned(tmp_path: Path) -> None:
    """The sha256 part alone, with no fixed path and storage.cfg's `path` lines (a value with a space kept
    whole)."""
    store = tmp_path / "my store"
    (store / "snippets").mkdir(parents=True)
    (store / "snippets" / "pvegpu-hook").write_text("hook\n")
    (store / "snippets" / "other").write_text("not pvegpu's\n")
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(
        f"dir: local\n\tpath /var/lib/vz\n\tcontent iso\n\nnfs: nfs1\n\tpath {store}\n\tserver x\n"
    )
    done = run(files_sha256_command((), storage_cfg=str(cfg)))
    lines = done.stdout.splitlines()
    assert f"dir {store}/snippets" in lines
    assert "dir /var/lib/vz/snippets" in lines
    assert [line for line in lines if line.endswith("/pvegpu-hook") and str(store) in line] == [
        f"{HOOK_TEXT_SHA256}  {store}/snippets/pvegpu-hook"
    ]
    assert not [line for line in lines if line.endswith("/other")]


def test_image_files_are_hashed_in_each_storage_while_the_vm_does_not_exist(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "import").mkdir(parents=True)
    (store / "import" / "d.qcow2").write_bytes(b"image")
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(f"dir: big\n\tpath {store}\n\tcontent import\n")
    config = tmp_path / "100.conf"
    command = files_sha256_command(
        (), storage_cfg=str(cfg), images=(("sha512", "d.qcow2"),), images_unless=str(config)
    )
    lines = run(command).stdout.splitlines()
    digest = hashlib.sha512(b"image").hexdigest()
    assert [line for line in lines if "/import/" in line] == [
        f"image sha512 {store}/import/d.qcow2",
        f"{digest}  {store}/import/d.qcow2",
        "image sha512 /var/lib/vz/import/d.qcow2",
    ]
    config.write_text("name: llm\n")
    assert [line for line in run(command).stdout.splitlines() if "/import/" in line] == []


IMAGE = "/var/lib/vz/import/d.qcow2"


def with_sha256_lines(*lines: str) -> list[str]:
    end = SAMPLE.index("#pvegpu-node:end")
    return [*SAMPLE[:end], *lines, *SAMPLE[end:]]


def test_an_image_digest_is_parsed_with_its_algorithm() -> None:
    digest = "ab" * 64
    state = parse_node_state(with_sha256_lines(f"image sha512 {IMAGE}", f"{digest}  {IMAGE}"))
    assert state.image_digest(IMAGE, "sha512") == digest
    assert IMAGE not in state.files_sha256
    with pytest.raises(KeyError) as error:
        state.image_digest(IMAGE, "sha256")
    assert (
        error.value.args[0]
        == f"{IMAGE} (sha256) is not in the node state read (pvegpu.run.node_state.node_request)"
    )
    absent = parse_node_state(with_sha256_lines(f"image sha256 {IMAGE}"))
    assert absent.image_digest(IMAGE, "sha256") is None


def test_an_image_digest_of_another_length_is_refused() -> None:
    line = f"{'ab' * 32}  {IMAGE}"
    with pytest.raises(FactParseError) as error:
        parse_node_state(with_sha256_lines(f"image sha512 {IMAGE}", line))
    assert str(error.value) == f"node state sha256: not a sha512 digest: {line!r}"


def test_image_digest_on_its_own(tmp_path: Path) -> None:
    image = tmp_path / "d.qcow2"
    image.write_bytes(b"image")
    command = ImageDigest().command(path=str(image), algorithm="sha384")
    assert parse_image_digest(run(command).stdout.splitlines()) == hashlib.sha384(b"image").hexdigest()
    absent = ImageDigest().command(path=str(tmp_path / "absent"), algorithm="sha256")
    assert parse_image_digest(run(absent).stdout.splitlines()) is None
    with pytest.raises(ValueError, match=r"^md5 is not a digest pvegpu hashes images with$"):
        ImageDigest().command(path=str(image), algorithm="md5")


def test_a_failing_part_fails_the_read_with_its_message(tmp_path: Path) -> None:
    done = run(node_read_command(NodeStateRequest(sysfs_root=str(tmp_path / "nowhere"))))
    assert done.returncode == 1
    assert done.stderr == f"pvegpu: sysfs root {tmp_path}/nowhere is not a readable directory\n"
    done = run(node_read_command(NodeStateRequest(cmdline_path=str(tmp_path / "cmdline"))))
    assert done.returncode == 1
    assert f"{tmp_path}/cmdline: No such file or directory" in done.stderr


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (SAMPLE[:-1], "node state: truncated output, the #pvegpu-node:end marker is missing"),
        (SAMPLE[:2], "node state: truncated output, the #pvegpu-node:cpu marker is missing"),
        (
            (SAMPLE[0], "not base64!", *SAMPLE[2:]),
            "node state hardware: not one line of gzip in base64 (Only base64 data is allowed)",
        ),
        (
            (SAMPLE[0], SAMPLE[1][:400], *SAMPLE[2:]),
            "node state hardware: not one line of gzip in base64 "
            "(Compressed file ended before the end-of-stream marker was reached)",
        ),
        (
            (SAMPLE[0], "aGVsbG8=", *SAMPLE[2:]),
            "node state hardware: not one line of gzip in base64 (Not a gzipped file (b'he'))",
        ),
        (("junk", *SAMPLE), "node state line 1: 'junk' outside the read's parts"),
        ((*SAMPLE, "junk"), f"node state line {len(SAMPLE) + 1}: 'junk' outside the read's parts"),
        (
            ("#pvegpu-node:cpu", *SAMPLE),
            "node state line 1: '#pvegpu-node:cpu' where #pvegpu-node:hardware belongs",
        ),
        (
            (*SAMPLE[:-1], "deadbeef  /x", "#pvegpu-node:end"),
            "node state sha256: unexpected line 'deadbeef  /x'",
        ),
    ],
)
def test_refused_output(lines: tuple[str, ...], message: str) -> None:
    with pytest.raises(FactParseError) as error:
        parse_node_state(lines)
    assert str(error.value) == message


def test_the_pve_part_brings_the_files(tmp_path: Path) -> None:
    """Only when requested: each file's bytes (a name with a space, an empty file), None for what is not a
    readable regular file; a read without the request has no `pve` part (the lab sample)."""
    conf, empty, directory = tmp_path / "100 conf", tmp_path / "empty", tmp_path / "dir"
    conf.write_bytes(b"cores: 2\n#\xc3\xa9\n")
    empty.write_bytes(b"")
    directory.mkdir()
    paths = (str(conf), str(empty), str(directory), str(tmp_path / "absent"))
    command = node_read_command(NodeStateRequest(sha256_paths=(), pve_files=paths))
    done = run(command)
    assert done.returncode == 0, done.stderr
    assert parse_node_state(done.stdout.splitlines()).pve_files == {
        str(conf): b"cores: 2\n#\xc3\xa9\n",
        str(empty): b"",
        str(directory): None,
        str(tmp_path / "absent"): None,
    }
    assert "#pvegpu-node:pve" not in node_read_command(NodeStateRequest())
    assert parse_node_state(SAMPLE).pve_files == {}


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (("#pvegpu-node:pve", "eA==\tetc/pve/x"), "node state pve: unexpected line 'eA==\\tetc/pve/x'"),
        (("#pvegpu-node:pve", "eA=\t/etc/pve/x"), "node state pve: /etc/pve/x is not in base64"),
        (("#pvegpu-node:pve", "missing /etc/pve/x"), "node state pve: unexpected line 'missing /etc/pve/x'"),
    ],
)
def test_refused_pve_part(tail: tuple[str, ...], message: str) -> None:
    with pytest.raises(FactParseError) as error:
        parse_node_state((*SAMPLE[:-1], *tail, SAMPLE[-1]))
    assert str(error.value) == message


def test_the_model_part_brings_the_stores_record_and_files(tmp_path: Path) -> None:
    """Only when requested: the fetcher's record and the store's files (its `.pvegpu/` left out), as the
    doctor's own read gives them; a store not there yet reads as no record and no directory."""
    store = tmp_path / "GLM 5"
    (store / ".pvegpu/partial").mkdir(parents=True)
    (store / "config.json").write_text("{}")
    (store / ".pvegpu/partial/x.part").write_bytes(b"12")
    record: dict[str, object] = {
        "repo": "a/b",
        "revision": None,
        "commit": "c" * 40,
        "complete": True,
        "files": {},
    }
    (store / ".pvegpu/model.json").write_text(json.dumps(record))
    done = run(node_read_command(NodeStateRequest(model_store=str(store))))
    assert done.returncode == 0, done.stderr
    state = parse_node_state(done.stdout.splitlines())
    assert state.model == ModelStoreRead().process(
        run(ModelStoreRead().command(str(store))).stdout.splitlines()
    )
    assert state.model is not None
    assert state.model[0] == ModelRecord("a/b", None, "c" * 40, True, {})
    assert sorted(state.model[1] or {}) == ["config.json"]
    absent = run(node_read_command(NodeStateRequest(model_store=str(tmp_path / "none"))))
    assert parse_node_state(absent.stdout.splitlines()).model == (None, None)
    assert "#pvegpu-node:model" not in node_read_command(NodeStateRequest())
    assert parse_node_state(SAMPLE).model is None
