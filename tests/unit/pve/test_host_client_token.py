"""The Proxmox API token file (`pve.token_file`), read on the operator's machine: the secret-file rules of
`pvegpu.models.secret_file` with the user running pyinfra allowed as owner; every refusal names the field and
the path, never the secret; the local reader counts a file's shape as the host-side `SecretFiles` fact
does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pvegpu.facts.secret_files import SecretFiles, parse_secret_files, read_local_secret
from pvegpu.models.secret_file import SecretFile, SecretFileKind, secret_file_problems
from pvegpu.pve.host_client import PveSetupError, read_token

SECRET = "0f6c5b7e-9a1d-4c2e-8b3f-5d6e7f8a9b0c"


def token(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "pve-token"
    path.write_bytes(content)
    path.chmod(mode)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(PveSetupError) as error:
        read_token(str(path))
    message = str(error.value)
    assert SECRET not in message
    return message


@pytest.mark.parametrize("content", [f"{SECRET}\n".encode(), SECRET.encode()])
def test_create_one_line_0600_gives_the_secret(tmp_path: Path, content: bytes) -> None:
    assert read_token(str(token(tmp_path, content))) == SECRET
    assert read_token(str(token(tmp_path, content, 0o400))) == SECRET


@pytest.mark.parametrize(
    ("content", "mode", "problem"),
    [
        (f"{SECRET}\n".encode(), 0o644,
         "has mode 644: group or others may read it; it must be 0600 or stricter (chmod 600)"),
        (f"{SECRET}\n".encode(), 0o640,
         "has mode 640: group or others may read it; it must be 0600 or stricter (chmod 600)"),
        (b"", 0o600, "is empty: it must hold the secret"),
        (b"\n", 0o600, "is empty: it must hold the secret"),
        (f"{SECRET}\nsecond\n".encode(), 0o600, "holds 2 lines; it must hold one line: the secret"),
        (f"{SECRET}\r\n".encode(), 0o600,
         "holds characters other than visible ASCII (a space, tab, carriage return, control or non-ASCII "
         "character)"),
        (f"PVEAPIToken {SECRET}".encode(), 0o600,
         "holds characters other than visible ASCII (a space, tab, carriage return, control or non-ASCII "
         "character)"),
    ],
)  # fmt: skip
def test_error_broken_rule_names_field_and_path(
    tmp_path: Path, content: bytes, mode: int, problem: str
) -> None:
    path = token(tmp_path, content, mode)
    assert refusal(path) == f"pve.token_file: {path} {problem}"


def test_error_every_broken_rule_one_line(tmp_path: Path) -> None:
    path = token(tmp_path, f"{SECRET}\n{SECRET}\n".encode(), 0o664)
    assert refusal(path).splitlines() == [
        f"pve.token_file: {path} has mode 664: group or others may read it; it must be 0600 or stricter "
        "(chmod 600)",
        f"pve.token_file: {path} holds 2 lines; it must hold one line: the secret",
    ]


def test_error_not_a_regular_file(tmp_path: Path) -> None:
    real = token(tmp_path, f"{SECRET}\n".encode())
    link = tmp_path / "link"
    link.symlink_to(real)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # opened, it would block until a writer comes: never opened
    assert refusal(tmp_path / "gone") == f"pve.token_file: {tmp_path}/gone does not exist on this machine"
    assert refusal(link) == f"pve.token_file: {link} is a symbolic link; it must be a regular file"
    assert refusal(fifo) == f"pve.token_file: {fifo} is not a regular file"
    assert refusal(tmp_path) == f"pve.token_file: {tmp_path} is not a regular file"


def test_owner_root_or_the_user_running_pyinfra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file away needs root")
    path = token(tmp_path, f"{SECRET}\n".encode())
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    os.chown(path, 1000, 1000)
    assert read_token(str(path)) == SECRET
    os.chown(path, 0, 0)
    assert read_token(str(path)) == SECRET
    os.chown(path, 2000, 2000)
    assert refusal(path) == (
        f"pve.token_file: {path} is owned by uid 2000; it must be owned by root or by uid 1000, the user "
        "running pyinfra"
    )


def test_owner_rule_names_root_alone_when_root_runs_pyinfra() -> None:
    observed = SecretFile("/t", SecretFileKind.FILE, uid=7, mode=0o600, size=3, lines=1)
    assert secret_file_problems("pve.token_file", observed, for_sglang=False, operator_uid=0) == (
        "pve.token_file: /t is owned by uid 7; it must be owned by root (chown root:root)",
    )


@pytest.mark.parametrize(
    "content",
    [b"", b"\n", b"k", b"k\n", b"k\nl", b"k\n\n", b"\n\nk", b"-k\n", b"a b\n", b"\xff\n", b"k\r\n", b"\t"],
)
def test_local_reader_counts_as_the_host_fact_does(tmp_path: Path, content: bytes) -> None:
    path = token(tmp_path, content)
    shell = subprocess.run(
        ["sh", "-c", SecretFiles().command([str(path)])], capture_output=True, text=True, check=True
    )
    assert read_local_secret(str(path)) == (parse_secret_files(shell.stdout.splitlines())[str(path)], content)
