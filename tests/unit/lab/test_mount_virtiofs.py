"""The LAB STAND-IN /sbin/mount.virtiofs (lab/standins/mount_virtiofs.py): util-linux mount(8)'s helper
convention `mount.<type> spec dir [-sfnv] [-N namespace] [-o options] [-t type.subtype]`, the binds it runs,
and a tag without a device failing as mount(8) reports the kernel's EINVAL.

SOURCE of the argument lists: captured on the lab machine (Debian 12, util-linux 2.38.1) with a probe helper
`mount.labprobe` printing its argv: `mount -t labprobe tagx /tmp/mx` -> `tagx /tmp/mx -o rw`; `... -o ro`
-> `tagx /tmp/mx -o ro`; `mount -t labprobe -o ro,noatime tagx /tmp/mx/` -> `tagx /tmp/mx -o ro,noatime`;
`mount -t labprobe.sub tagx /tmp/mx` -> `tagx /tmp/mx -o rw -t labprobe.sub`. SOURCE of the error text:
captured the same way, `mount -t tmpfs -o bogusopt=1 none /tmp/mx` (the kernel's EINVAL) -> exit 32 and
the two lines below with `none` as the source."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.standins import mount_virtiofs
from lab.standins.mount_virtiofs import Request, UsageError, commands, parse, share_of, wrong_fs

USAGE = "usage: mount.virtiofs spec dir [-sfnv] [-N namespace] [-o options] [-t type.subtype]"

PARSED = {
    "rw": (["models", "/mnt/x", "-o", "rw"], Request("models", "/mnt/x", ("rw",))),
    "ro": (["models", "/mnt/x", "-o", "ro"], Request("models", "/mnt/x", ("ro",))),
    "ro-noatime": (["models", "/mnt/x", "-o", "ro,noatime"], Request("models", "/mnt/x", ("ro", "noatime"))),
    "subtype": (["models", "/mnt/x", "-o", "rw", "-t", "virtiofs.x"], Request("models", "/mnt/x", ("rw",))),
    "flags-bundled": (["m", "/d", "-sfnv", "-o", "ro"], Request("m", "/d", ("ro",), fake=True)),
    "namespace": (["m", "/d", "-N", "/proc/7/ns/mnt"], Request("m", "/d", namespace="/proc/7/ns/mnt")),
    "no-options": (["m", "/d"], Request("m", "/d")),
}


@pytest.mark.parametrize(("argv", "request_"), PARSED.values(), ids=PARSED.keys())
def test_parse_takes_mounts_helper_convention(argv: list[str], request_: Request) -> None:
    assert parse(argv) == request_


REFUSED = {
    "one-argument": (["models"], USAGE),
    "option-first": (["-o", "ro", "models", "/mnt/x"], USAGE),
    "unknown-flag": (["models", "/mnt/x", "-x"], f"option -x not recognized\n{USAGE}"),
    "missing-value": (["models", "/mnt/x", "-o"], f"option -o requires argument\n{USAGE}"),
    "third-argument": (["models", "/mnt/x", "extra"], f"unexpected argument 'extra'\n{USAGE}"),
}


@pytest.mark.parametrize(("argv", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_error_parse_refuses_another_command_line(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse(argv)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("options", "read_only"),
    [((), False), (("rw",), False), (("ro",), True), (("ro", "noatime"), True), (("ro", "rw"), False)],
)
def test_read_only_is_the_last_of_ro_and_rw(options: tuple[str, ...], read_only: bool) -> None:
    assert Request("m", "/d", options).read_only is read_only


def test_commands_bind_then_remount_read_only() -> None:
    share = "/var/lib/pvegpu-lab/virtiofs/models"
    assert commands(Request("models", "/mnt/x", ("rw",)), share) == [["mount", "--bind", share, "/mnt/x"]]
    assert commands(Request("models", "/mnt/x", ("ro",), namespace="/proc/7/ns/mnt"), share) == [
        ["mount", "-N", "/proc/7/ns/mnt", "--bind", share, "/mnt/x"],
        ["mount", "-N", "/proc/7/ns/mnt", "-o", "remount,bind,ro", "/mnt/x"],
    ]


def test_share_of_is_a_mount_point_named_by_the_tag(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()  # a directory, but nothing bound there: no device of that tag
    assert share_of(Request("models", "/mnt/x"), str(tmp_path)) is None
    assert share_of(Request("proc", "/mnt/x"), "/") == "/proc"
    assert [share_of(Request(tag, "/mnt/x"), "/") for tag in ("", ".", "..", "proc/self")] == [None] * 4


def test_error_tag_without_a_device_fails_as_mount_does(capsys: pytest.CaptureFixture[str]) -> None:
    expected = (
        "mount: /mnt/x: wrong fs type, bad option, bad superblock on nosuchtag, missing codepage or helper "
        "program, or other error.\n"
        "       dmesg(1) may have more information after failed mount system call.\n"
    )
    assert wrong_fs("/mnt/x", "nosuchtag") == expected
    assert mount_virtiofs.main(["nosuchtag", "/mnt/x", "-o", "ro"]) == 32
    assert capsys.readouterr().err == expected


def test_error_usage_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert mount_virtiofs.main(["models"]) == 1
    assert capsys.readouterr().err == f"mount.virtiofs: {USAGE}\n"
